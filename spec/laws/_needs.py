"""What a law needs of a target, stated one way: a `spec.registry.Need` from the constructors
here, combined with ``&`` (``needs=keyword(BIAS) & ndim(3, 4)``). Each says why a target that
lacks it is skipped, naming the declaration it would take, and its text is the docs' "Needs:".
"""

from __future__ import annotations

from spec import dtypes
from spec.keywords import Keyword
from spec.registry import Need
from spec.target import Target


def keyword(kw: Keyword) -> Need:
    """``fn`` takes the keyword (its Target field is True)."""
    args = "/".join(f"{a}=" for a in kw.passes)

    def missing(t: Target) -> str | None:
        return None if getattr(t, kw.field) else f"needs {args} (target declares {kw.field}=False)"

    return Need(missing, f"{args} ({kw.field})")


def ndim(*ranks: int) -> Need:
    """Inputs of one of these ranks (2 = (n, d), 3 = (heads, n, d), 4 = (batch, heads, n, d))."""
    said = " or ".join(map(str, ranks))

    def missing(t: Target) -> str | None:
        if any(r in t.ndims for r in ranks):
            return None
        return f"needs inputs of rank {said} (target declares ndims={t.ndims})"

    return Need(missing, f"inputs of rank {said} (ndims)")


causal_mode = Need(
    lambda t: None if t.causal_alignment else "needs a causal mode (target declares causal_alignment=None)",
    "a causal mode (causal_alignment not None)")

mask = Need(lambda t: None if t.supports_mask else "needs mask= (target declares supports_mask=False)",
            "mask= (supports_mask)")

gqa = Need(
    lambda t: None if t.supports_gqa else "needs grouped K/V heads (target declares supports_gqa=False)",
    "grouped K/V heads (supports_gqa)")

gradients = Need(lambda t: None if t.has_gradients else "needs gradients (target declares no grad_fn)",
                 "gradients (grad_fn)")

def grad_extra(name: str) -> Need:
    """``grad_fn`` also returns the gradient ``name`` (``dbias``, ``dsinks``: `Target.grad_extras`)."""

    def missing(t: Target) -> str | None:
        if name in t.grad_extras:
            return None
        return f"needs {name} from grad_fn (target declares grad_extras={t.grad_extras})"

    return Need(missing, f"{name} among the gradients (grad_extras)")


ml_dtypes = Need(
    lambda t: None if dtypes.has_ml_dtypes() else
    "needs ml_dtypes for float8_e4m3fn, which is not installed: pip install ml-dtypes",
    "ml_dtypes (float8_e4m3fn)")

deterministic = Need(
    lambda t: None if t.deterministic else "needs deterministic=True (target declares deterministic=False)",
    "deterministic=True")

exact_masking = Need(
    lambda t: None if t.exact_masking else "needs exact masking (target declares exact_masking=False)",
    "exact masking (exact_masking)")


policy_declared = Need(
    lambda t: ("target declares masked_rows='any' (fully-masked rows unspecified)"
               if t.policies == {"any"} else None),
    "a masked-row policy other than 'any'")


def not_declared(field: str, value: object, wants: str) -> Need:
    """The target does not declare ``field=value``: a declaration of how it takes a keyword
    (``alibi_shape="heads"``) under which the law's calls (``wants``) cannot be drawn."""

    def missing(t: Target) -> str | None:
        return f"needs {wants} (target declares {field}={value!r})" if getattr(t, field) == value else None

    return Need(missing, f"{wants} (not {field}={value!r})")


def either(first: Need, second: Need) -> Need:
    """One of two capabilities; when neither is there the reason names both, and adds the second's
    own reason where it is not a plain "needs ..." (a declaration that rules it out)."""
    text = f"{first.text} or {second.text}"

    def missing(t: Target) -> str | None:
        why = second(t)
        if first(t) is None or why is None:
            return None
        return f"needs {text}" + ("" if why.startswith("needs ") else f" ({why})")

    return Need(missing, text)


def both(first: Need, second: Need) -> Need:
    """Two capabilities where a target lacking both is told both: ``a & b`` names only the first
    missing, so a float8 law skipped for want of ml_dtypes would send the user to install it and
    then, once installed, to a declaration the first note never mentioned."""

    def missing(t: Target) -> str | None:
        whys = [why for why in (first(t), second(t)) if why]
        if not whys:
            return None
        return " and ".join([whys[0], *(w.removeprefix("needs ") for w in whys[1:])])

    return Need(missing, f"{first.text} and {second.text}")
