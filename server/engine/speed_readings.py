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

A model whose manifest names a `word_language_model` chooses among every candidate of every reading instead
(each reading then returns all its beams' candidates): the highest summed log-probability + the word LM's
weighted score (server/decoding/word_lm.py), a request read once included. When the winner is not its
reading's best sequence, one more round forces it through the model at its reading's speed, so that its
attention, word times and confidences are its own. The n best it returns are then its reading's candidates
in that order, each with the search's own score.
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
    FinishReason,
    GenerationResult,
    ScoredSequence,
    StreamedToken,
)
from attnserve.server.attention.explanation import explain
from attnserve.server.decoding.hotwords import hotword_words
from attnserve.server.decoding.prepared import PreparedRequest
from attnserve.server.decoding.word_lm import WordRescorer
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
    forced: Future | None = None  # the word LM's winner forced through the model, when it needs its own round


class SpeedReadings:
    """Runs the speed readings of one audio model's requests.

    Args:
        engine: its `prepare` validates and preprocesses each reading, `submit_prepared` queues it (the
            follow-ups `admitted`), `cancel` stops it, `preprocessor` gives the samples and column spans.
        speeds: the manifest's `decoding.speeds`.
    """

    def __init__(self, engine: ModelEngine, speeds: Sequence[float], rescorer: WordRescorer | None = None):
        self._engine = engine
        self._speeds = [1.0] + [s for s in speeds if s != 1.0]  # the recording first: it wins ties
        self._rescorer = rescorer
        self._in_flight = InFlight()

    def applies(self, prepared: PreparedRequest) -> bool:
        """Whether `prepared` (the recording as given) is read at more than one speed or its candidates are
        rescored. Only audio models' manifests may name speeds or a word LM, and their requests all carry audio."""
        return ((len(self._speeds) > 1 or self._rescorer is not None) and prepared.speed is None
                and prepared.beam_size > 1 and prepared.sampling is None and prepared.forced_ids is None
                and (self._rescorer is not None or not prepared.request.decoding.read_once))

    def submit(self, prepared: PreparedRequest, on_token: Callable[[StreamedToken], None] | None,
               on_start: Callable[[], None] | None) -> Future[GenerationResult]:
        """Queues every reading of `prepared` (see applies); returns the request's future."""
        started = time.perf_counter()
        every = self._rescorer is not None  # every beam's candidate comes back, to be rescored
        readings = [_Reading(1.0, _scored(prepared, 1.0, every))]
        samples, rate = self._engine.preprocessor.samples(prepared.request.audio)
        for speed in self._speeds[1:] if not prepared.request.decoding.read_once else []:
            audio = AudioInput(samples=samples, sample_rate_hz=round(rate * speed))
            try:
                other = self._engine.prepare(dataclasses.replace(prepared.request, audio=audio))
            except ValueError:  # slowed past the window, or sped below one analysis window: not read
                continue
            readings.append(_Reading(speed, _scored(other, speed, every)))
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
        for running in [r.future for r in job.readings] + ([job.forced] if job.forced is not None else []):
            self._engine.cancel(running)
        job.outer.cancel()
        return True

    def _finish(self, job: _Job, results: list[GenerationResult]) -> None:
        """Answers with the best-scoring reading (streaming its tokens first, as beam search does), or with
        the candidate the word LM ranks first."""
        if self._rescorer is not None:
            self._rescore(job, results)
            return
        best = max(range(len(results)), key=lambda i: (results[i].nbest[0].score, -i))
        self._answer(job, results[0], results[best], job.readings[best], job.readings[best].streamed)

    def _answer(self, job: _Job, recording: GenerationResult, winner: GenerationResult, reading: _Reading,
                streamed: list[StreamedToken], nbest: list[ScoredSequence] | None = None) -> None:
        result, tokens = self._as_recorded(job, recording, winner, reading, streamed, nbest)
        for token in tokens:
            job.on_token(token)
        settle(job.outer, result)

    def _rescore(self, job: _Job, results: list[GenerationResult]) -> None:
        """Every reading's candidates ranked by the word LM; the winner forced through the model when it is
        not its reading's best sequence."""
        hotwords = frozenset(hotword_words(job.readings[0].prepared.request.decoding.hotwords))
        ranked = sorted(((self._rescorer.score(c, hotwords), i, j) for i, r in enumerate(results)
                         for j, c in enumerate(r.nbest)),
                        key=lambda x: (-x[0], x[1], x[2]))  # ties: the recording first, then the beam's order
        _, i, j = ranked[0]
        reading, winner = job.readings[i], results[i].nbest[j]
        nbest = [results[i].nbest[k] for _, reading_index, k in ranked if reading_index == i]
        if j == 0:
            self._answer(job, results[0], results[i], reading, reading.streamed, nbest)
            return
        ids = tuple(t.id for t in winner.tokens)
        if winner.finish_reason is FinishReason.EOS:
            ids += (self._engine.manifest.special_tokens.eos,)
        streamed: list[StreamedToken] = []
        # The request's own rules stay (hotwords among them): its candidates were scored under them.
        job.forced = self._engine.submit_prepared(reading.prepared.forcing(ids),
                                                  streamed.append if job.on_token is not None else None, None,
                                                  admitted=True)
        if job.outer.done():  # cancelled while the readings finished: the forced round is not needed
            self._engine.cancel(job.forced)
            return
        when_all_done(job.outer, [job.forced],
                      lambda done: self._answer(job, results[0], done[0], reading, streamed, nbest))

    def _as_recorded(self, job: _Job, recording: GenerationResult, winner: GenerationResult, reading: _Reading,
                     streamed: list[StreamedToken], nbest: list[ScoredSequence] | None
                     ) -> tuple[GenerationResult, list[StreamedToken]]:
        """The winning reading's result and streamed tokens in the recording's time and columns; `nbest`:
        the candidates in the order chosen (None: the winner's own)."""
        wanted = job.readings[0].prepared.request.decoding.num_return_sequences
        total = time.perf_counter() - job.started
        timings = dataclasses.replace(winner.timings, total_seconds=total)
        ranked = winner.nbest if nbest is None else nbest
        result = dataclasses.replace(winner, nbest=ranked[:wanted] if wanted > 1 else [], timings=timings)
        tokens = streamed if job.on_token is not None else []
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


def _scored(prepared: PreparedRequest, speed: float, every: bool) -> PreparedRequest:
    """`prepared` as the reading at `speed`, returning its best sequence's score (n-best of at least 2) so
    that readings compare, or `every` beam's candidate for the word LM."""
    least = prepared.beam_size if every else 2
    return dataclasses.replace(prepared, speed=speed, num_return_sequences=max(least, prepared.num_return_sequences))

