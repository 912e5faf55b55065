"""impl.keywords: the keywords declared once give each attention function the signature it is called
with — every documented keyword by name, with its default — and a call is checked against it as
Python checks a ``def``."""

import inspect
import re
from pathlib import Path

import numpy as np
import pytest

from impl import attention, attention_backward, flash_attention

DOCS = Path(__file__).resolve().parents[2] / "docs" / "impl.md"

# The keywords and defaults each function had when each was written out by hand (and still has).
MATHS = {"causal": False, "mask": None, "scale": None, "bias": None, "window": None, "align": None,
         "softcap": None, "sinks": None, "kv_lengths": None, "cu_seqlens_q": None, "cu_seqlens_k": None,
         "dropout_p": 0.0, "seed": None, "alibi_slopes": None, "attention_chunk": None,
         "qv": None, "d_v": None}
SPARSE = {"topk_indices": None, "topk_length": None, "topk_blocks": None, "topk_block_size": None}
CACHE = {"block_table": None, "k_descale": None, "v_descale": None}
SIGNATURES = {
    attention: MATHS | SPARSE | CACHE | {"return_weights": False, "return_lse": False},
    attention_backward: MATHS | SPARSE | {"align": "top_left", "return_extras": False},
    flash_attention: {"causal": False, "scale": None, "block": (256, 2048), "window": None, "softcap": None,
                      "return_lse": False, "alibi_slopes": None, "threads": None, "num_splits": 1,
                      "attention_chunk": None, "qv": None, "d_v": None} | SPARSE | CACHE
                     | {"kv_lengths": None},
}


def keywords_of(fn):  # -> {name: default} of the keyword-only parameters inspect.signature shows
    return {name: p.default for name, p in inspect.signature(fn).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY}


@pytest.mark.parametrize("fn", list(SIGNATURES), ids=lambda fn: fn.__name__)
def test_signature_shows_every_keyword_with_its_default(fn):
    assert keywords_of(fn) == SIGNATURES[fn]
    positional = [name for name, p in inspect.signature(fn).parameters.items()
                  if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional == ["q", "k", "v", "d_out"][: 4 if fn is attention_backward else 3]


def test_every_keyword_docs_impl_md_lists_for_attention_is_in_its_signature():
    row = next(line for line in DOCS.read_text().splitlines() if line.startswith("| `attention(q, k, v, *,"))
    documented = re.search(r"attention\(q, k, v, \*, ([^)]*)\)", row).group(1).split(", ")
    assert set(documented) == set(keywords_of(attention))


@pytest.mark.parametrize("fn", [attention, flash_attention], ids=lambda fn: fn.__name__)
def test_an_unknown_keyword_is_refused_as_python_refuses_it(fn):
    x = np.ones((2, 3))
    with pytest.raises(TypeError, match=rf"^{fn.__name__}\(\) got an unexpected keyword argument 'causl'$"):
        fn(x, x, x, causl=True)
    with pytest.raises(TypeError, match="positional"):
        fn(x, x, x, True)


@pytest.mark.parametrize(("fn", "name"), [(flash_attention, "mask"), (attention_backward, "block_table"),
                                          (attention_backward, "return_lse")])
def test_a_keyword_of_another_function_is_refused(fn, name):
    x = np.ones((2, 3))
    args = (x, x, x, x) if fn is attention_backward else (x, x, x)
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
        fn(*args, **{name: None})


def test_a_keyword_left_out_means_its_default():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 5, 4)) for _ in range(3))
    d_out = rng.standard_normal((2, 5, 4))
    np.testing.assert_array_equal(attention(q, k, v), attention(q, k, v, **SIGNATURES[attention]))
    for got, want in zip(attention_backward(q, k, v, d_out),
                         attention_backward(q, k, v, d_out, **SIGNATURES[attention_backward]), strict=True):
        np.testing.assert_array_equal(got, want)
    flash = flash_attention(q, k, v, **SIGNATURES[flash_attention])
    np.testing.assert_array_equal(flash_attention(q, k, v), flash)


def test_the_default_is_not_shared_between_calls():
    # Each call gets its own dict of keywords: one call's values never leak into the next.
    x = np.ones((1, 1, 3, 2))  # every score 2/√2: three visible keys give lse = log 3 + √2
    attention(x, x, x, causal=True, kv_lengths=np.array([1]))
    _, lse = attention(x, x, x, return_lse=True)
    np.testing.assert_allclose(lse, np.full((1, 1, 3), np.log(3) + np.sqrt(2)))
