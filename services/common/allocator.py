"""The C allocator of a server process: memory freed is given back to the system.

glibc's malloc serves an allocation of at least its mmap threshold (128 KiB) with a
mapping of its own, unmapped when freed; but when such a block is freed it raises the
threshold to the block's size (up to 32 MiB), so that later blocks of that size come
from its heaps instead, and a heap gives back only its top. A stream that sent a page
of 750 KiB thus leaves the next pages in the heaps, and after a burst of streams most
of what they held stays in the process (measured before the byte budget: 128 unread
streams took a TranscriptService from 80 to 565 MiB, and it still held 461 MiB after
they had ended). Setting the threshold once fixes it where it starts: large buffers
(pages, messages, grpc's copies) are mapped and unmapped each time, which costs a
system call per buffer, not per entry; the same run then went back to 82 MiB.

The variable MALLOC_MMAP_THRESHOLD_, when set, is glibc's own setting: left alone.
Other C libraries (musl) are left alone too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

# mallopt's parameter number (malloc.h) and the threshold set: glibc's own default.
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 128 * 1024


def give_back_freed_memory() -> bool:
    """Fix glibc's mmap threshold (no dynamic raise); True when it was set here."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    try:
        libc.gnu_get_libc_version  # noqa: B018  # glibc only (musl's mallopt does nothing)
    except AttributeError:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) != 1:
        log.warning("mallopt(M_MMAP_THRESHOLD) failed: freed memory may stay in the process")
        return False
    return True
