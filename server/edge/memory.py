"""Gives heap memory back to the system: after loading, and after large requests are freed.

Why: glibc serves big allocations with mmap (returned on free) only below a threshold that grows, after each
such block is freed, to its size (up to 32 MiB); from then on blocks of that size come from the heap and
per-thread arenas, which keep freed pages. A server receiving multi-megabyte requests on several gRPC and
worker threads then grew for good: rounds of 48 concurrent 18 MB requests, refused, added 700-850 MB each
(266 MB -> 3.4 GB after 8 rounds). Two measures, both glibc-only (no-ops elsewhere):

  * `fix_mmap_threshold` pins the threshold at MMAP_THRESHOLD_BYTES, so every request-sized buffer (the
    received bytes, protobuf's copy, decoded samples and pixels) is its own mapping, unmapped when freed;
  * `RECLAIMER` trims every arena (malloc_trim) once large requests worth RECLAIM_BYTES have been freed,
    at most every RECLAIM_INTERVAL_SECONDS, on a short-lived thread, for what smaller blocks leave behind.

Building an ONNX Runtime session parses the whole graph into memory that is freed once the session holds
its own copy of the weights: `release_free_heap` after loading (bundled translator: 348 -> 334 MB).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import threading
import time

# Blocks from this size up are mmapped. 1 MiB: a decoder step's numpy arrays of a wide batch (logits of 64
# rows) stay below it; a request worth trimming for is above it.
MMAP_THRESHOLD_BYTES = 1 << 20
# Requests this size or more count towards the next trim when their handler ends.
LARGE_REQUEST_BYTES = 1 << 20
RECLAIM_BYTES = 16 << 20
RECLAIM_INTERVAL_SECONDS = 0.5
# glibc's mallopt parameter number of M_MMAP_THRESHOLD (malloc.h).
_M_MMAP_THRESHOLD = -3


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def release_free_heap() -> bool:
    """glibc's malloc_trim(0), which trims every arena; False where the C library has none (musl, macOS)."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return False
    trim(0)
    return True


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Pins glibc's mmap threshold (and so stops it growing); False where there is no mallopt."""
    mallopt = getattr(_libc(), "mallopt", None)
    return bool(mallopt is not None and mallopt(_M_MMAP_THRESHOLD, threshold))


class Reclaimer:
    """Trims the heap after enough large requests were freed, rate-limited, off the caller's thread.

    Args:
        threshold: bytes of large requests freed that call for a trim.
        interval: least seconds between two trims (a trim takes a few milliseconds and the arenas' locks).
    """

    def __init__(self, threshold: int = RECLAIM_BYTES, interval: float = RECLAIM_INTERVAL_SECONDS):
        self.threshold = threshold
        self.interval = interval
        self.trims = 0
        self._freed = 0
        self._last = 0.0
        self._pending = False
        self._lock = threading.Lock()

    def released(self, size: int) -> None:
        """Notes a request of `size` bytes whose handler ended (any thread); may schedule a trim."""
        if size < LARGE_REQUEST_BYTES:
            return
        with self._lock:
            self._freed += size
            if self._pending or self._freed < self.threshold:
                return
            self._pending = True
            delay = max(0.0, self._last + self.interval - time.monotonic())
        # Later, not now: the caller (a handler, a deserializer) still holds the bytes it reports.
        timer = threading.Timer(max(delay, 0.05), self._trim)
        timer.daemon = True
        timer.start()

    def _trim(self) -> None:
        with self._lock:
            self._freed = 0
        release_free_heap()
        with self._lock:
            self._pending = False
            self._last = time.monotonic()
            self.trims += 1


RECLAIMER = Reclaimer()
