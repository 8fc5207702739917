"""Deadline-aware admission: what a request will cost a model, and whether it can finish before its deadline.

Why: without it every request was admitted whether or not it could finish in time. Under overload the
queue and the running batch then fill with work that is cancelled at its deadline after it cost the model
most of its time: 200 clips of 20 s with a 20 s deadline got 0 answers in time. A request refused at
once (RESOURCE_EXHAUSTED, reason "deadline", with a retry hint) costs nothing, and the work that is admitted
can finish, so the share of answers delivered in time stays near what the model can do saturated.

The estimate is made before preprocessing, from what is cheap to read:

  * the request's own work: its decoder steps (output tokens: the model's observed output per input unit,
    a unit being a character of text, a second of audio, or a whole image; capped by max_new_tokens) times
    the time a step will take with every admitted row sharing it: a line fitted to the observed steps
    against the rows admitted while they ran (the mean of their count when the request was admitted and
    when it ended), a fixed part (the weights read once per call) plus a part per row, evaluated at the rows
    there will be (under --max-rows); until the rows seen vary, a step is taken to cost the same per row;
    plus the observed encoder time;
  * the work ahead of it: rows of the admitted requests not finished yet. While they fit under --max-rows a
    newcomer joins at the next step; beyond, it waits for rows to free: the excess over --max-rows, in
    batches of --max-rows, times the observed decode time of a request.

Observations are exponentially weighted (RATE) over answered requests; a model not yet observed admits
everything, and so does an idle one (nothing admitted): estimates learned under heavy load would otherwise
refuse every request and never see one answered again. Requests without a deadline are always admitted. A request is refused when its estimate is
over its remaining time; SLACK keeps estimation noise from refusing what would just fit.
"""

from __future__ import annotations

import dataclasses
import threading

from attnserve.server.engine.decoded_size import audio_seconds
from attnserve.api.generation import (
    GenerationRequest,
    GenerationResult,
    InputKind,
    ModelInfo,
    OverloadedError,
    resolved_beam_size,
)

# Weight of the newest observation in each running average.
RATE = 0.2
# Admit only what is estimated to finish within this share of its time left: requests admitted after it
# slow its steps a little more, up to the row bound the estimate keeps under its own deadline.
SLACK = 0.8


@dataclasses.dataclass(frozen=True)
class Ticket:
    """An admitted request's rows, and the rows admitted with it then (itself included)."""

    rows: int
    sharing: int


@dataclasses.dataclass(frozen=True)
class Estimate:
    """What admitting a request would cost, in seconds and rows."""

    wait_seconds: float  # until rows free for it
    own_seconds: float  # its decode
    rows: int  # its beams

    @property
    def seconds(self) -> float:
        return self.wait_seconds + self.own_seconds


class CostModel:
    """One model's observed costs and admitted work (any thread).

    Args:
        info: the model (its input kind, limits, default beams).
        max_rows: rows it decodes at once (continuous batching's --max-rows; windowed: its batch size).
    """

    def __init__(self, info: ModelInfo, max_rows: int):
        self.info = info
        self.max_rows = max(1, max_rows)
        self._lock = threading.Lock()
        self._steps = _StepFit()  # one decode step's seconds against the rows sharing it
        self._request_seconds: float | None = None  # one request's decode
        self._encode_seconds: float | None = None  # the encoder call (queueing is the wait's to count)
        self._tokens_per_unit: float | None = None  # output tokens per input unit (see `units`)
        self._rows_admitted = 0  # rows of admitted requests not finished yet

    def estimate(self, request: GenerationRequest) -> Estimate | None:
        """The request's cost now; None until the model has answered a request (nothing to go by)."""
        rows = resolved_beam_size(request.decoding, self.info.default_beam_size)
        with self._lock:
            if not self._steps:
                return None
            steps = min(self._max_new_tokens(request), self._tokens_per_unit * units(request, self.info) + 1)
            sharing = min(self._rows_admitted + rows, self.max_rows)
            excess = self._rows_admitted + rows - self.max_rows
            wait = max(0.0, excess) / self.max_rows * self._request_seconds
            return Estimate(wait, self._encode_seconds + steps * self._steps.seconds(sharing), rows)

    def admit(self, request: GenerationRequest, remaining: float | None) -> Ticket:
        """Counts the request's rows as admitted (give them back with `finished`).

        Args:
            remaining: seconds to its deadline; None = none (always admitted).

        Raises:
            OverloadedError: (reason "deadline") it cannot finish in time; `retry_after` is the wait ahead.
        """
        estimate = self.estimate(request) if remaining is not None and self._rows_admitted else None
        if estimate is not None and estimate.seconds > SLACK * remaining:
            raise OverloadedError(
                f"model '{self.info.name}' cannot answer within the deadline: about {estimate.wait_seconds:.1f} s "
                f"until rows free and {estimate.own_seconds:.1f} s of decoding, {remaining:.1f} s left; retry in "
                f"{max(estimate.wait_seconds, 0.1):.1f} s or with a longer deadline",
                reason="deadline", retry_after=round(estimate.wait_seconds, 1))
        rows = resolved_beam_size(request.decoding, self.info.default_beam_size)
        with self._lock:
            self._rows_admitted += rows
            return Ticket(rows, self._rows_admitted)

    def finished(self, ticket: Ticket) -> None:
        with self._lock:
            self._rows_admitted -= ticket.rows

    def observe(self, request: GenerationRequest, result: GenerationResult, ticket: Ticket) -> None:
        """Learns from an answered request (before it is `finished`): its step time against the rows sharing
        it, its decode time, its encoder time and its output per input unit."""
        steps = len(result.tokens) + 1  # EOS, or the step that hit the limit
        timings = result.timings
        with self._lock:
            sharing = min((ticket.sharing + self._rows_admitted) / 2, self.max_rows)
            self._steps.add(sharing, timings.decode_seconds / steps)
            self._request_seconds = _average(self._request_seconds, timings.decode_seconds)
            self._encode_seconds = _average(self._encode_seconds, timings.encode_seconds)
            per_unit = len(result.tokens) / max(units(request, self.info), 1e-9)
            self._tokens_per_unit = _average(self._tokens_per_unit, per_unit)

    def _max_new_tokens(self, request: GenerationRequest) -> int:
        asked = request.decoding.max_new_tokens
        return asked if 0 < asked <= self.info.max_new_tokens else self.info.max_new_tokens


def units(request: GenerationRequest, info: ModelInfo) -> float:
    """The request's input in the units its output scales with: characters, seconds of audio, images."""
    if info.input_kind is InputKind.AUDIO:
        return audio_seconds(request)
    if info.input_kind is InputKind.IMAGE:
        return 1.0
    return float(max(len(request.text), 1))


def _average(old: float | None, new: float) -> float:
    return new if old is None else (1 - RATE) * old + RATE * new


class _StepFit:
    """Step seconds = fixed + per_row x rows, fitted by least squares over exponentially weighted
    observations (weight RATE for the newest); the fixed part and the slope are kept at or above 0."""

    def __init__(self):
        self._n = self._x = self._y = self._xx = self._xy = 0.0  # weighted sums

    def __bool__(self) -> bool:
        return self._n > 0

    def add(self, rows: float, seconds: float) -> None:
        keep = 1 - RATE
        self._n = keep * self._n + 1
        self._x = keep * self._x + rows
        self._y = keep * self._y + seconds
        self._xx = keep * self._xx + rows * rows
        self._xy = keep * self._xy + rows * seconds

    def seconds(self, rows: float) -> float:
        mean_x, mean_y = self._x / self._n, self._y / self._n
        variance = self._xx / self._n - mean_x * mean_x
        if variance < 0.25 * max(mean_x, 1.0):  # the rows seen barely vary: the same cost per row
            return mean_y / max(mean_x, 1e-9) * rows
        slope = max(0.0, (self._xy / self._n - mean_x * mean_y) / variance)
        fixed = max(0.0, mean_y - slope * mean_x)
        return fixed + slope * rows

