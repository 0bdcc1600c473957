"""d3ray/train/allocator.py: with glibc's thresholds kept high, a 4 MiB buffer comes from the heap (no mapping of
its own) and stays in the process when freed; with glibc's defaults it is a mapping of its own, unmapped when freed."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = r"""
import ctypes, sys
from d3ray.train.allocator import keep_freed_memory

def mappings():
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)

libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
took = keep_freed_memory() if sys.argv[1] == "keep" else None
before = mappings()
buffer = libc.malloc(4 << 20)
during = mappings()
libc.free(buffer)
after = mappings()
print(took, during - before, after - during)
"""


def run(mode: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True)
    return out.stdout.split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and /proc/self/maps: Linux")
def test_keep_freed_memory_serves_a_step_sized_buffer_from_the_heap():
    took, mapped, unmapped = run("keep")
    if took == "False":
        pytest.skip("this Linux's C library has no mallopt (not glibc)")
    assert took == "True"
    assert int(mapped) <= 0 and int(unmapped) == 0, "a 4 MiB buffer got a mapping of its own"
    default = run("default")
    assert int(default[1]) == 1 and int(default[2]) == -1, f"glibc's defaults: expected a mapping of its own, {default}"
