"""An attention problem in KernelBench's shape, for ``python -m spec audit``: its level-1 problem
(scaled dot-product attention, no mask) at 8 of its heads — batch 32 and 32 heads there, the
sequence length (512) and width (1,024) kept — inputs uniform in [0, 1) as ``torch.rand`` draws
them, and its tolerance for these, ``allclose(atol=rtol=1e-2)``. Written for this project, in
NumPy: the harness seeds NumPy's global generator before each trial."""

import numpy as np

batch_size, num_heads, sequence_length, embedding_dimension = 1, 8, 512, 1024
atol = rtol = 1e-2


def get_inputs():
    shape = (batch_size, num_heads, sequence_length, embedding_dimension)
    return [np.random.random_sample(shape).astype(np.float32) for _ in range(3)]  # noqa: NPY002 (seeded)


def reference(q, k, v):
    """softmax(q·kᵀ / √d) · v in float32."""
    s = q @ np.swapaxes(k, -1, -2) / np.float32(np.sqrt(q.shape[-1]))
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v
