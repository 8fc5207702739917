"""Speed readings: a recording decoded at several playback speeds, the best-scoring reading answering.

A recognizer trained on few voices hears some speakers better slowed down or sped up (pitch and tempo
together, as a tape played at another speed). A model whose manifest names `decoding.speeds`, e.g.
[1.0, 0.9, 1.1], decodes each beam-searched audio request once per speed, as ordinary rows of the same
batches, and answers with the reading whose best sequence has the highest score (log-probability per
token, the beam's own ranking; the recording as given wins ties). Measured on speech-en 12, 8 beams: mean
WER of recorded dev and dev_channel 61.7% -> 60.1% with [1.0, 0.9, 1.1] (models/speech-en/README.md).

A reading at speed s is the recording's samples relabelled at s x the model's rate, which the preprocessor
resamples as it resamples any input: 1 s of the recording lasts 1/s s in the reading. The answer speaks of
the recording as given: word times are multiplied by s, and attention columns (each a time span of the
reading) are spread over the recording's columns by how much of their time each overlaps.

Greedy and sampled requests decode once (no score to compare), as do requests that ask to be read once
(`DecodingOptions.read_once`: a third of the compute). A reading the preprocessor refuses is skipped: a clip
near the window is not slowed down, nor a clip of a few milliseconds sped up. Follow-up readings are part of
an accepted request, so a full queue never refuses them; cancelling the request cancels every reading.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np

from attnserve.api.generation import (
    AttentionMatrix,
    AudioInput,
    GenerationResult,
    StreamedToken,
)
from attnserve.server.attention.explanation import explain
from attnserve.server.decoding.prepared import PreparedRequest
from attnserve.server.engine.joined import InFlight, settle, when_all_done

if TYPE_CHECKING:
    from attnserve.server.engine.engine import ModelEngine


def column_map(reading_spans: tuple[np.ndarray, np.ndarray], spans: tuple[np.ndarray, np.ndarray],
               speed: float) -> np.ndarray:
    """(C', C) weights spreading each column of a reading at `speed` over the recording's columns.

    Args:
        reading_spans, spans: (starts, ends) in seconds of the reading's C' and the recording's C columns.

    Returns:
        Row j: the share of reading column j's time (moved to the recording's time, x speed) that each
        recording column covers; rows sum to 1 (a column past the recording's end goes to its last column).
    """
    starts, ends = reading_spans[0] * speed, reading_spans[1] * speed
    overlap = np.minimum(ends[:, None], spans[1][None, :]) - np.maximum(starts[:, None], spans[0][None, :])
    weights = np.clip(overlap, 0.0, None)
    outside = weights.sum(1) <= 0
    weights[outside, -1] = 1.0
    return weights / weights.sum(1, keepdims=True)


@dataclasses.dataclass
class _Reading:
    speed: float
    prepared: PreparedRequest
    streamed: list[StreamedToken] = dataclasses.field(default_factory=list)
    future: Future | None = None


@dataclasses.dataclass
class _Job:
    readings: list[_Reading]
    on_token: Callable[[StreamedToken], None] | None
    outer: Future
    started: float


class SpeedReadings:
    """Runs the speed readings of one audio model's requests.

    Args:
        engine: its `prepare` validates and preprocesses each reading, `submit_prepared` queues it (the
            follow-ups `admitted`), `cancel` stops it, `preprocessor` gives the samples and column spans.
        speeds: the manifest's `decoding.speeds`.
    """

    def __init__(self, engine: ModelEngine, speeds: Sequence[float]):
        self._engine = engine
        self._speeds = [1.0] + [s for s in speeds if s != 1.0]  # the recording first: it wins ties
        self._in_flight = InFlight()

    def applies(self, prepared: PreparedRequest) -> bool:
        """Whether `prepared` (the recording as given) is read at more than one speed. Only audio models'
        manifests may name speeds, and their requests all carry audio."""
        return (len(self._speeds) > 1 and prepared.speed is None and not prepared.request.decoding.read_once
                and prepared.beam_size > 1 and prepared.sampling is None and prepared.forced_ids is None)

    def submit(self, prepared: PreparedRequest, on_token: Callable[[StreamedToken], None] | None,
               on_start: Callable[[], None] | None) -> Future[GenerationResult]:
        """Queues every reading of `prepared` (see applies); returns the request's future."""
        started = time.perf_counter()
        readings = [_Reading(1.0, _scored(prepared, 1.0))]
        samples, rate = self._engine.preprocessor.samples(prepared.request.audio)
        for speed in self._speeds[1:]:
            audio = AudioInput(samples=samples, sample_rate_hz=round(rate * speed))
            try:
                other = self._engine.prepare(dataclasses.replace(prepared.request, audio=audio))
            except ValueError:  # slowed past the window, or sped below one analysis window: not read
                continue
            readings.append(_Reading(speed, _scored(other, speed)))
        job = _Job(readings, on_token, Future(), started)
        # The recording itself first; a full queue refuses it, and then nothing is kept.
        for i, reading in enumerate(readings):
            capture = reading.streamed.append if on_token is not None else None
            try:
                reading.future = self._engine.submit_prepared(reading.prepared, capture,
                                                              on_start if i == 0 else None, admitted=i > 0)
            except Exception:  # closing: the readings already queued go too
                for queued in readings[:i]:
                    self._engine.cancel(queued.future)
                raise
        self._in_flight.add(job.outer, job)
        when_all_done(job.outer, [r.future for r in readings], functools.partial(self._finish, job))
        return job.outer

    def cancel(self, future: Future) -> bool:
        """Cancels a request read at several speeds; False if `future` is not one."""
        job = self._in_flight.get(future)
        if job is None:
            return False
        for reading in job.readings:
            self._engine.cancel(reading.future)
        job.outer.cancel()
        return True

    def _finish(self, job: _Job, results: list[GenerationResult]) -> None:
        """Answers with the best-scoring reading (streaming its tokens first, as beam search does)."""
        best = max(range(len(results)), key=lambda i: (results[i].nbest[0].score, -i))
        result, tokens = self._as_recorded(job, results[0], results[best], job.readings[best])
        for token in tokens:
            job.on_token(token)
        settle(job.outer, result)

    def _as_recorded(self, job: _Job, recording: GenerationResult, winner: GenerationResult,
                     reading: _Reading) -> tuple[GenerationResult, list[StreamedToken]]:
        """The winning reading's result and streamed tokens in the recording's time and columns."""
        wanted = job.readings[0].prepared.request.decoding.num_return_sequences
        total = time.perf_counter() - job.started
        timings = dataclasses.replace(winner.timings, total_seconds=total)
        result = dataclasses.replace(winner, nbest=winner.nbest[:wanted] if wanted > 1 else [], timings=timings)
        tokens = reading.streamed if job.on_token is not None else []
        if reading.speed == 1.0:
            return result, tokens
        preprocessor, speed = self._engine.preprocessor, reading.speed
        spans = preprocessor.column_spans(len(job.readings[0].prepared.source.features))
        moved = column_map(preprocessor.column_spans(len(reading.prepared.source.features)), spans, speed)
        end = job.readings[0].prepared.source.seconds
        words = [dataclasses.replace(w, start_seconds=min(w.start_seconds * speed, end),
                                     end_seconds=min(w.end_seconds * speed, end)) for w in winner.words]
        attention = winner.attention
        if attention is not None:
            weights = np.asarray(attention.weights, dtype=np.float64).reshape(-1, moved.shape[0]) @ moved
            attention = AttentionMatrix(weights.tolist(), attention.row_labels, recording.attention.col_labels,
                                        attention.layer, attention.reduction,
                                        explain(weights, moved.shape[1]) if attention.explanation else None)
        tokens = [t if t.attention is None else
                  dataclasses.replace(t, attention=(np.asarray(t.attention) @ moved).tolist()) for t in tokens]
        result = dataclasses.replace(result, words=words, attention=attention, source_tokens=recording.source_tokens)
        return result, tokens


def _scored(prepared: PreparedRequest, speed: float) -> PreparedRequest:
    """`prepared` as the reading at `speed`, returning its best sequence's score (n-best of at least 2) so
    that readings compare."""
    return dataclasses.replace(prepared, speed=speed, num_return_sequences=max(2, prepared.num_return_sequences))

