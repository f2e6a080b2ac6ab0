"""What building a proposer's history costs the process: seconds and resident memory.

`bench drafter` (and its soak) read resident memory before and after a build, with freed
heap handed back to the system first, so that the growth is what the build keeps live.
"""

from __future__ import annotations

import ctypes
import gc
import os
import time
from typing import Callable, TypeVar

T = TypeVar("T")


def release_free_heap() -> None:
    """Hand freed heap back to the system (glibc's malloc_trim, where there is one), so that
    resident memory, and its growth, is what is live."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def rss_bytes() -> int:
    """Resident memory of this process (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def measured_build(build: Callable[[], T]) -> tuple[T, float, int]:
    """(build(), its wall seconds, the resident memory it added), freed heap handed back
    before and after."""
    release_free_heap()
    before = rss_bytes()
    t0 = time.perf_counter()
    result = build()
    seconds = time.perf_counter() - t0
    release_free_heap()
    return result, seconds, rss_bytes() - before


__all__ = ["measured_build", "release_free_heap", "rss_bytes"]
