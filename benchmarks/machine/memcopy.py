"""The local limit for moving bytes: single-threaded memory copy rate with numpy."""
from __future__ import annotations

import time

import numpy as np


def copy_rate(nbytes: int, repeats: int) -> dict[str, object]:
    """Seconds per ``np.copyto`` of ``nbytes`` (bytes copied per second = nbytes / seconds).

    One thread, like one rank's share of this machine; a first copy faults
    the pages in and is not timed.
    """
    src = np.ones(nbytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        seconds.append(time.perf_counter() - start)
    return {"bytes": int(src.nbytes), "seconds": seconds}
