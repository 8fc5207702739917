"""Native libraries' stderr (ONNX Runtime's C++ logger) turned into records of Python's logging.

ONNX Runtime writes its warnings straight to file descriptor 2, coloured, past Python: one such line
breaks a log collector that expects one JSON object per line. `capture()` points descriptor 2 at a pipe,
keeps a duplicate of the real stderr for the log handler to write to, and a daemon thread turns each line
read from the pipe into a record: the `onnxruntime` logger at the level its prefix names
(`[W:onnxruntime:Default, file.cc:12 Function] text`), colour codes removed; any other line (a C library's,
or Python's own stderr) goes to the `stderr` logger as a warning.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from typing import TextIO

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# ONNX Runtime's line: "<date> <time> [W:onnxruntime:<logger>, <file>:<line> <function>] <message>".
_ORT_LINE = re.compile(r"\[([VIWEF]):onnxruntime:([^,\]]*)(?:,\s*([^\]]*))?\]\s*(.*)")
_LEVELS = {"V": logging.DEBUG, "I": logging.INFO, "W": logging.WARNING, "E": logging.ERROR, "F": logging.CRITICAL}
_captured: TextIO | None = None


def capture() -> TextIO:
    """Routes descriptor 2 through logging (once per process); returns the real stderr to log to."""
    global _captured
    if _captured is not None:
        return _captured
    real = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    sys.stderr.flush()
    threading.Thread(target=_forward, args=(read_end,), name="native-stderr", daemon=True).start()
    _captured = real
    return real


def record(line: str) -> tuple[str, int, str]:
    """(logger name, level, message) of one line written to stderr."""
    line = _ANSI.sub("", line).rstrip()
    match = _ORT_LINE.search(line)
    if match is None:
        return "stderr", logging.WARNING, line
    severity, _logger, where, message = match.groups()
    return "onnxruntime", _LEVELS[severity], f"{message} ({where})" if where else message


def _forward(read_end: int) -> None:
    with os.fdopen(read_end, "r", encoding="utf-8", errors="replace") as pipe:
        for line in pipe:
            if line.strip():
                name, level, message = record(line)
                logging.getLogger(name).log(level, "%s", message)
