"""The trainers' heap: glibc's malloc set to keep what a CPU step frees for the next step.

glibc serves an allocation above ``M_MMAP_THRESHOLD`` with a mapping of its own, unmapped again when it is
freed, and gives the top of the heap back to the system when more than ``M_TRIM_THRESHOLD`` of it is free.
Both start low (128 KiB) and rise only as mapped chunks are freed, to the largest chunk freed so far. A
training step on the CPU allocates and frees its activations and gradients, megabytes each, every step: at
those thresholds each step maps, faults in and zeroes its pages anew. A process that once freed a larger
buffer (the default D3's scoring pass, whose logits span ``tokens_per_pass`` tokens) has higher thresholds
from then on: part of why, with glibc's defaults, the default D3's steps were 22% faster than random order's
at L = 32 on the 2-core box, for the same arithmetic (docs/results/bench-pipeline-default-d3-2026-12-05.md,
which also says what is left of that gap).

:func:`keep_freed_memory` fixes both thresholds high (``mallopt``): allocations up to 32 MiB come from the
heap and up to 1 GiB of freed memory stays in the process. Every trainer does it at start
(``train.keep_freed_memory``, default on): the steps of every scheduler get the same heap.
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["keep_freed_memory"]

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's largest M_MMAP_THRESHOLD on a 64-bit system


def keep_freed_memory(mmap_threshold: int = MMAP_THRESHOLD_MAX, trim_threshold: int = 1 << 30) -> bool:
    """Set glibc's ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` in this process (see the module docstring).

    Returns:
        True if glibc took both; False off Linux or without glibc's ``mallopt`` (musl, macOS): nothing changed.
    """
    if not sys.platform.startswith("linux"):
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # the C library the process runs on
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))
