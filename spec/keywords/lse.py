"""The logsumexp asked for beside the output (``return_lse=True``).

Its declaration (`LSE`) and the functions it is made of; its laws are `spec.laws.lse`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from spec.keywords.record import Keyword, Leaves, Returns, not_floats

if TYPE_CHECKING:
    from spec.inputs import Inputs
    from spec.target import Target

Array = np.ndarray


def lse_returned(meant: Inputs, returned: tuple[Array, ...], out_shape: tuple[int, ...]) -> str | None:
    """What is wrong with the lse returned: it must be floats shaped as the output less its last
    axis, ``[..., n_q]``."""
    (lse,) = returned
    wrong = not_floats(lse, "with return_lse=True the target returned lse as")
    if wrong is None and lse.shape != out_shape[:-1]:
        wrong = f"the target returned lse of shape {lse.shape}, expected {out_shape[:-1]}"
    return wrong


def residuals_need_lse(target: Target) -> str | None:
    """A backward that takes the forward's residuals (``grad_takes_residuals``) takes its lse."""
    if target.grad_takes_residuals and (target.grad_fn is None or not target.returns_lse):
        return ("Target grad_takes_residuals=True needs a grad_fn and returns_lse=True "
                "(the residuals are what the forward returns with return_lse=True)")
    return None


LSE = Keyword(
    name="lse",
    field="returns_lse",
    passes=("return_lse",),
    meaning="return_lse=True: the target returns (out, lse), lse [..., n_q] the natural-log logsumexp of "
            "each row's final scores (sinks included), -inf for a row that sees nothing; float32 for "
            "float16/bfloat16/float32 inputs, float64 for float64.",
    terms=(Leaves("it asks for an output beside the attention, and changes no number of it"),),
    received=lambda case, asked: (bool(asked),),
    switch=True,
    returns=Returns(("lse",), "with return_lse=True", check=lse_returned),
    check_target=residuals_need_lse,
)
