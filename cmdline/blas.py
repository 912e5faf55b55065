"""BLAS on one thread, for a while: the one limiter that `spec`'s runner, `impl.flash`'s worker
threads and `impl.bench`'s one-thread measurements share.

threadpoolctl (a dependency of the project) is imported when the limiter is first used, so that
importing this module stays on the standard library, as the rest of `cmdline`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any


@functools.cache
def _blas_controller() -> Any:
    """threadpoolctl's handle on the BLAS libraries loaded when first asked (a search that takes
    milliseconds, so done once)."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


@contextlib.contextmanager
def one_thread_blas() -> Iterator[None]:
    """Within: BLAS runs on one thread; after, on as many as before. The count is process-wide:
    threads that lower and restore it at once must take turns, or one restores the other's
    lowered count. A framework's own threads (OpenMP, a thread pool) are left as they are."""
    with _blas_controller().limit(limits=1, user_api="blas"):
        yield
