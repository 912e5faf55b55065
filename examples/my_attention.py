"""An attention function written outside attention-spec, and what it declares to the suite.

    python -m spec check examples.my_attention:target
    pytest --attention-target=examples.my_attention:target
"""

import numpy as np

import spec


def attention(q, k, v, *, causal=False, mask=None):
    """softmax(q kᵀ/√d_k) v, the textbook way, in the inputs' dtype."""
    scores = (q @ np.swapaxes(k, -1, -2)) / q.dtype.type(np.sqrt(q.shape[-1]))
    if causal:
        scores = np.where(np.tri(*scores.shape[-2:], dtype=bool), scores, -np.inf)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    with np.errstate(invalid="ignore"):  # a row with nothing visible: -inf - -inf = NaN, on purpose
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (weights / weights.sum(axis=-1, keepdims=True)) @ v


# It takes mask=, and a query that sees no key gets NaN (0/0): declared, so the suite checks
# exactly that instead of failing it. Not declared: scale=, grouped K/V heads, float16.
# With no keys at all (n_k = 0) the row max raises NumPy's ValueError: declared as a refusal.
target = spec.Target(attention, name="my_attention", supports_mask=True, masked_rows="nan",
                     empty_keys="raise")

# The same function declaring only mask=: the suite then holds it to the default, zeros.
undeclared = spec.Target(attention, name="my_attention, NaN rows undeclared", supports_mask=True)
