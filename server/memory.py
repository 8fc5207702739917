"""Returns heap memory that is free but still held by the C allocator to the system.

Building an ONNX Runtime session parses the whole graph (protobuf, initializers) into memory that is freed
once the session holds its own copy of the weights; glibc keeps most of those pages in its heap. Measured on
the bundled translator: 348 MB after loading, 334 MB after trimming (and 43 MB returned after a burst of 200
requests), for about 2 ms of work when there is something to return.
"""

from __future__ import annotations

import ctypes
import ctypes.util


def release_free_heap() -> bool:
    """glibc's malloc_trim(0); False where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        trim = None
    if trim is None:
        return False
    trim(0)
    return True
