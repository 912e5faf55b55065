"""The keywords of impl's attention functions, each declared once.

A keyword is one line of a `TypedDict` below: its name and its type. `impl.attention`,
`impl.attention_backward` and `impl.flash_attention` name only q, k, v and their own few
parameters (``return_weights``, ``d_out``, ``return_extras``, ``return_lse``) in their ``def``s,
and take the keywords of the groups they understand as ``**keywords: Unpack[...]``:

    group             keywords                                              taken by
    CommonKeywords    causal scale window softcap kv_lengths alibi_slopes   all three
                        attention_chunk topk_indices topk_length
                        topk_blocks topk_block_size
    LatentKeywords    qv d_v                                                all three
    Keywords          + mask bias align sinks cu_seqlens_q cu_seqlens_k     attention, its backward
                        dropout_p seed (and LatentKeywords)
    CacheKeywords     block_table k_descale v_descale                       attention, flash

(and `impl.flash.Tiling`, flash's ``block`` and ``threads``), so adding a keyword is one line
here, its maths, its line in `impl.attention`'s docstring (which says what each one means) and in
docs/impl.md's list of them. The typed variants of a call — ``return_lse=True`` returns
``(out, lse)`` — are these groups joined with one of `WithLse`, `WithoutLse`, `WithWeights`,
`WithoutWeights`, for mypy's overloads. `takes` gives each function the signature that
``inspect.signature`` and ``help()`` show, every keyword by name with its default, and `given`
checks a call's keywords against it, as Python checks a ``def``'s, and fills in the defaults.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from inspect import Parameter
from typing import Any, ForwardRef, Literal, TypedDict, TypeVar, cast

from impl.masks import Align


class CommonKeywords(TypedDict, total=False):
    """The keywords `impl.attention`, `impl.attention_backward` and `impl.flash_attention` all take."""

    causal: bool
    scale: float | None
    window: tuple[int, int] | None
    attention_chunk: int | None
    softcap: float | None
    kv_lengths: Any
    alibi_slopes: Any
    topk_indices: Any
    topk_length: Any
    topk_blocks: Any
    topk_block_size: int | None


class LatentKeywords(TypedDict, total=False):
    """MLA: ``qv`` (absorbed queries' value part) and ``d_v`` (values read from the keys' latent)."""

    qv: Any
    d_v: int | None


class Keywords(CommonKeywords, LatentKeywords, total=False):
    """The keywords of the maths: every one that `impl.attention` and `impl.attention_backward` take."""

    mask: Any
    bias: Any
    align: Align | None
    sinks: Any
    cu_seqlens_q: Any
    cu_seqlens_k: Any
    dropout_p: float
    seed: int | None


class CacheKeywords(TypedDict, total=False):
    """A paged or float8 KV cache (`impl.cache`): `impl.attention` and `impl.flash_attention` read
    one; no backward does."""

    block_table: Any
    k_descale: Any
    v_descale: Any


DEFAULTS: dict[str, Any] = {"causal": False, "dropout_p": 0.0}
"""The defaults that are not None; every other keyword defaults to None (not given)."""


# The return variants: a call's keywords joined with one of each pair type its result.


class WithWeights(TypedDict):
    return_weights: Literal[True]


class WithoutWeights(TypedDict, total=False):
    return_weights: Literal[False]


class WithLse(TypedDict):
    return_lse: Literal[True]


class WithoutLse(TypedDict, total=False):
    return_lse: Literal[False]


F = TypeVar("F", bound=Callable[..., Any])
K = TypeVar("K", bound=Mapping[str, Any])


def takes(group: type, **defaults: Any) -> Callable[[F], F]:
    """Give ``fn(..., **keywords: Unpack[group])`` the signature it is called with: its own
    parameters, with the keywords of ``group`` (keyword-only) before its own keyword-only ones,
    each keyword at its value in ``defaults``, else in `DEFAULTS`, else None. ``fn`` itself is
    returned, not wrapped (so its doctests, source and tracebacks are its own)."""

    def sign(fn: F) -> F:
        own = inspect.signature(fn)
        before = [p for p in own.parameters.values() if p.kind is not Parameter.VAR_KEYWORD]
        at = next((i for i, p in enumerate(before) if p.kind is Parameter.KEYWORD_ONLY), len(before))
        declared = [
            Parameter(name, Parameter.KEYWORD_ONLY, default=defaults.get(name, DEFAULTS.get(name)),
                      annotation=_spelled(annotation))
            for name, annotation in group.__annotations__.items()
        ]
        parameters = [*before[:at], *declared, *before[at:]]
        fn.__signature__ = own.replace(parameters=parameters)  # type: ignore[attr-defined]
        return fn

    return sign


def _spelled(annotation: Any) -> Any:
    """An annotation as the ``def`` would have written it (a TypedDict's are ForwardRefs)."""
    return annotation.__forward_arg__ if isinstance(annotation, ForwardRef) else annotation


def given(fn: Callable[..., Any], keywords: K) -> K:
    """The keywords of a call to ``fn`` (declared by `takes`), those left out at their defaults.

    A keyword ``fn`` does not take is refused as Python refuses one: ``TypeError: fn() got an
    unexpected keyword argument 'name'``.
    """
    defaults = _keyword_defaults(fn)
    for name in keywords:
        if name not in defaults:
            raise TypeError(f"{fn.__name__}() got an unexpected keyword argument {name!r}")
    return cast(K, defaults | dict(keywords))


@functools.cache
def _keyword_defaults(fn: Callable[..., Any]) -> dict[str, Any]:
    """The keywords `takes` declared for ``fn`` (not its own parameters), with their defaults."""
    code = fn.__code__
    own = set(code.co_varnames[: code.co_argcount + code.co_kwonlyargcount])
    return {name: p.default for name, p in inspect.signature(fn).parameters.items() if name not in own}
