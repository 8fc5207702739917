"""The server's logging: level and format from the command line, one access line per request, and rejections
(bad requests, overload, missing tokens) rate-limited so that abuse cannot flood the log.

`--log-format json` writes one JSON object per line (time in ISO 8601 with its UTC offset, level, logger,
message, and the access fields as keys of their own) for log collectors; `text` is the human-readable
default. `serve` also routes what native code writes to stderr, ONNX Runtime's warnings among them,
through the same handler (server/edge/native_log.py), so the stream stays one format.
"""

from __future__ import annotations

import datetime
import json
import logging
import secrets
import threading
import time

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
# Fields an access line carries; the JSON formatter writes them as keys of their own.
ACCESS_FIELDS = ("method", "model", "code", "tokens", "latency_ms", "request_id")

access_logger = logging.getLogger("attnserve.access")


class JsonFormatter(logging.Formatter):
    """One JSON object per record; exceptions go in "traceback"."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            # Timezone-aware, in UTC: collectors on other machines read the same instant.
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry |= {field: getattr(record, field) for field in ACCESS_FIELDS if hasattr(record, field)}
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(level: str = "info", fmt: str = "text", native: bool = False) -> None:
    """Sets the root logger's level and its one stderr handler's format (replacing earlier handlers).

    Args:
        native: also route what native code writes to stderr through this handler (the server does; once
            set, for the rest of the process).
    """
    if native:
        from attnserve.server.edge import native_log

        handler = logging.StreamHandler(native_log.capture())
    else:
        handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S%z"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def new_request_id() -> str:
    """An id for a request whose client sent none, so that its log lines can still be told apart."""
    return "gen-" + secrets.token_hex(8)


def log_access(method: str, model: str, code: str, tokens: int, seconds: float, request_id: str) -> None:
    """Writes the access line of one finished generation request."""
    fields = dict(method=method, model=model, code=code, tokens=tokens, latency_ms=round(seconds * 1000, 1))
    fields["request_id"] = request_id
    access_logger.info(
        "%s model=%s code=%s tokens=%d latency_ms=%.1f request_id=%s", *fields.values(), extra=fields
    )


class RateLimitedLog:
    """Logs at most `per_second` lines a second (a token bucket); counts the rest and reports them later.

    Args:
        logger: where lines go.
        per_second: sustained lines a second; bursts up to the same number pass.
        level: the level of every line.
    """

    def __init__(self, logger: logging.Logger, per_second: float = 5.0, level: int = logging.INFO):
        self.logger = logger
        self.per_second = per_second
        self.level = level
        self._tokens = per_second
        self._last = time.monotonic()
        self._suppressed = 0
        self._lock = threading.Lock()

    def log(self, message: str, *args) -> bool:
        """Logs the line if the budget allows; returns whether it did."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.per_second, self._tokens + (now - self._last) * self.per_second)
            self._last = now
            if self._tokens < 1:
                self._suppressed += 1
                return False
            self._tokens -= 1
            suppressed, self._suppressed = self._suppressed, 0
        if suppressed:
            self.logger.log(self.level, "(%d similar lines suppressed)", suppressed)
        self.logger.log(self.level, message, *args)
        return True


# Requests refused for the client's reasons (invalid, too large, overload, unauthenticated).
rejections = RateLimitedLog(logging.getLogger("attnserve.rejections"))
