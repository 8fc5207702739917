"""How many bytes a request may carry, derived from what the served models accept, and enforced early.

Why: a server that accepts 32 MiB messages for models that read 7,000 characters holds every oversized
message several times over while it is refused (gRPC's receive buffer of 16 KiB HTTP/2 frames, the Python
bytes, protobuf's copy, the Python string), on several threads at once. glibc keeps that freed memory in
its per-thread arenas, so 16 concurrent 30 MiB requests left the process 1.7 GB larger for good. The
cure is to never receive what no model could use:

  1. gRPC's own receive limit is the largest request any served model accepts (its input limit for its
     input kind, plus headroom for the other fields); gRPC refuses bigger messages with
     RESOURCE_EXHAUSTED before they reach Python.
  2. Before parsing, a request for a model with a smaller limit (a text model beside an audio one) is
     refused with OUT_OF_RANGE: the model name is read from the raw bytes without parsing the rest.
  3. Requests being handled hold at most `max_inflight_bytes` between them; past that a request is refused
     with RESOURCE_EXHAUSTED, so many concurrent large (audio, image) requests cannot pile up.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator, Mapping

from attnserve.api.generation import InputKind, InputTooLargeError, ModelInfo, OverloadedError

# Room for the fields beside the input (model name, languages, request id, options) and their tags.
HEADROOM_BYTES = 16 * 1024
# UTF-8 needs at most this many bytes per character.
UTF8_MAX_BYTES = 4


def input_bytes(info: ModelInfo, max_text_chars: int | None = None) -> int:
    """The most bytes a model's input may take on the wire, for its input kind.

    Args:
        info: the model's description (its input kind and limits).
        max_text_chars: text models only: the longest text its preprocessor reads (tokens x the longest
            piece); None = assume 32 characters per token.
    """
    if info.input_kind is InputKind.AUDIO:
        return info.audio.max_bytes  # raw samples are 4 bytes each, like the WAV limit counts them
    if info.input_kind is InputKind.IMAGE:
        return info.image.max_bytes
    if info.input_kind is InputKind.VIDEO:
        # Stills: each PNG/JPEG file's own few bytes of protobuf framing, at most max_frames of them.
        return info.video.max_bytes + 8 * info.video.max_frames
    chars = max_text_chars if max_text_chars is not None else info.max_source_tokens * 32
    return chars * UTF8_MAX_BYTES


def request_bytes(input_limit: int) -> int:
    """A whole request's limit: its input's, an eighth more for encoding overhead, and the headroom."""
    return input_limit + input_limit // 8 + HEADROOM_BYTES


@dataclasses.dataclass(frozen=True)
class MessageLimits:
    """Per-model request size limits and the server-wide ones gRPC enforces."""

    # Model name -> the largest GenerateRequest it accepts, in bytes.
    request_bytes: Mapping[str, int]
    # The largest response the server sends (attention matrices of long outputs are the big ones).
    send_bytes: int = 32 * 1024 * 1024

    @property
    def receive_bytes(self) -> int:
        """gRPC's receive limit: the largest request any model accepts (requests of other RPCs are tiny)."""
        return max(self.request_bytes.values(), default=HEADROOM_BYTES)

    def check(self, data: bytes) -> None:
        """Refuses a serialized GenerateRequest over its model's limit, without parsing it.

        Raises:
            InputTooLargeError: the request is larger than its model accepts.
        """
        if len(data) <= HEADROOM_BYTES:
            return  # every model accepts this much; skip the scan
        model = peek_string_field(data, field_number=1)  # GenerateRequest.model
        limit = self.request_bytes.get(model) if model is not None else None
        if limit is not None and len(data) > limit:
            raise InputTooLargeError(
                f"request is {len(data)} bytes; model {model!r} accepts requests of at most {limit} bytes"
            )


def peek_string_field(data: bytes, field_number: int, max_fields: int = 64) -> str | None:
    """The last value of a top-level string field in serialized protobuf `data`, or None.

    Walks the top-level tags only and skips every other field by its length, so a large input field is
    never copied. Gives up (None) on malformed data or after `max_fields` fields: the parser decides then.
    """
    view, pos, found = memoryview(data), 0, None
    try:
        for _ in range(max_fields):
            if pos >= len(view):
                return found
            tag, pos = _varint(view, pos)
            number, wire_type = tag >> 3, tag & 7
            if wire_type == 0:
                _, pos = _varint(view, pos)
            elif wire_type == 1:
                pos += 8
            elif wire_type == 5:
                pos += 4
            elif wire_type == 2:
                length, pos = _varint(view, pos)
                if number == field_number:
                    found = bytes(view[pos : pos + length]).decode("utf-8")
                pos += length
            else:
                return None  # groups: not in this API
    except (IndexError, UnicodeDecodeError):
        return None
    return None


def _varint(view: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = view[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")


class InflightBytes:
    """A budget of request bytes being handled at once; a request that does not fit is refused, not queued.

    Args:
        limit: the most bytes of requests in progress together; one request of the largest accepted size
            must fit (checked by the caller that builds it).
    """

    def __init__(self, limit: int):
        self.limit = limit
        self._used = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def hold(self, size: int) -> Iterator[None]:
        """Counts `size` bytes for the duration of the block.

        Raises:
            OverloadedError: the budget cannot take them now.
        """
        with self._lock:
            if self._used + size > self.limit:
                raise OverloadedError(
                    f"{self._used} bytes of requests are in progress and this one has {size}; the server takes "
                    f"{self.limit} at once (--max-inflight-request-mb); retry later", reason="inflight_bytes"
                )
            self._used += size
        try:
            yield
        finally:
            with self._lock:
                self._used -= size

    @property
    def used(self) -> int:
        with self._lock:
            return self._used


class RequestAdmission:
    """The admission checks of the generation RPCs (see `errors.Admission`): size before parsing, budget after.

    Args:
        limits: the per-model request limits.
        inflight: the budget of request bytes handled at once.
        methods: full names of the RPCs whose requests are GenerateRequests ("/pkg.Service/Method").
    """

    def __init__(self, limits: MessageLimits, inflight: InflightBytes, methods: frozenset[str]):
        self.limits = limits
        self.inflight = inflight
        self._methods = methods

    def check(self, method: str, data: bytes) -> None:
        if method in self._methods:
            self.limits.check(data)

    def hold(self, method: str, size: int) -> contextlib.AbstractContextManager:
        return self.inflight.hold(size) if method in self._methods else contextlib.nullcontext()
