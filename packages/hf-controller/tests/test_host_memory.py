"""``release_host_memory``: freed heap memory that glibc keeps goes back to the system."""

from __future__ import annotations

import sys

import pytest

from hf_controller import release_host_memory, resident_bytes
from hf_controller.host_memory import _malloc_trim

BLOCK = 100 * 1024  # below glibc's mmap threshold (128 KiB): served from the heap
BLOCKS = 2000  # ~200 MB


@pytest.mark.skipif(_malloc_trim() is None, reason="the C library has no malloc_trim (not glibc)")
def test_freed_heap_blocks_behind_a_live_one_are_returned() -> None:
    blocks = [bytearray(BLOCK) for _ in range(BLOCKS)]
    for block in blocks:  # touch every page, so each block is resident
        block[::4096] = b"\x01" * len(block[::4096])
    keep = blocks[-1]  # the heap's top stays in use: free() alone cannot shrink it
    del blocks
    released = release_host_memory()
    assert released is not None
    assert released > BLOCKS * BLOCK // 2, f"only {released} bytes were returned"
    assert len(keep) == BLOCK
    again = release_host_memory()
    assert again is not None and again < BLOCK * 10  # nothing left to give back


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_resident_bytes_counts_this_process() -> None:
    before = resident_bytes()
    assert before is not None and before > 10 * 1024 * 1024  # the interpreter at least
