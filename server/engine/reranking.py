"""Reranking a beam's candidates by how well each one translates back into the source (text models that
translate both ways).

A beam search ranks candidates by log p(candidate | source) / length alone, which favours short, fluent
outputs that drop part of the source. The same model, translating each candidate back, says how much of
the source the candidate keeps: log p(source | candidate). A request with `reverse_weight` w > 0 gets the
candidate with the best

    log p(candidate | source) / length + w * log p(source | candidate)

(the source's log-probability summed over its tokens, its EOS included). Measured on translate-zh-en 6, 8
beams, w = 0.1 (chosen on the dev split), held-out test split, chrF: everyday sentences zh->en 43.6 -> 45.7
and en->zh 24.7 -> 25.2, software text 52.0 -> 54.6 and 34.0 -> 35.7 (docs/translation-quality.md).

The work is three rounds of ordinary requests through the model's own queue and batches:
1. the beam search, returning every beam's candidate;
2. one forced request per candidate (`PreparedRequest.forced_ids`): the candidate as the source, the
   original source (EOS included) as the output every step must take; its score is the log-probability;
3. when the winner is not the beam's best and the request asked for attention: one forced request in the
   original direction for the winner, so that its attention is its own.
Follow-up rounds are part of an accepted request, so a full queue never refuses them. Cancelling the
request cancels whichever round runs.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

from attnserve.api.generation import FinishReason, GenerationResult, ScoredSequence
from attnserve.server.decoding.prepared import PreparedRequest
from attnserve.server.decoding.word_lm import summed_log_prob
from attnserve.server.engine.joined import InFlight, settle, when_all_done
from attnserve.server.inputs.preprocessing import TextSource

if TYPE_CHECKING:
    from attnserve.server.engine.engine import ModelEngine


@dataclasses.dataclass
class _Rerank:
    """One reranked request in flight."""

    prepared: PreparedRequest
    outer: Future
    started: float
    running: list[Future] = dataclasses.field(default_factory=list)  # the current round's futures


class Reranker:
    """Runs reranked requests for one engine.

    Args:
        engine: its `submit_prepared` queues the rounds (the follow-ups `admitted`), its `cancel` stops
            them, its manifest gives the start tokens and EOS.
    """

    def __init__(self, engine: ModelEngine):
        self._engine = engine
        self._in_flight = InFlight()

    def submit(self, prepared: PreparedRequest, on_start: Callable[[], None] | None = None) -> Future:
        """Queues the beam search of a request whose `reverse_language` is set; returns its final future."""
        started = time.perf_counter()
        # The beam search itself; may refuse (a full queue): nothing is kept then.
        first = self._engine.submit_prepared(dataclasses.replace(prepared, reverse_language=None), None, on_start)
        job = _Rerank(prepared, Future(), started)
        self._in_flight.add(job.outer, job)
        self._run(job, [first], lambda results: self._score(job, results[0]))
        return job.outer

    def cancel(self, future: Future) -> bool:
        """Cancels a reranked request (any round); False if `future` is not one."""
        job = self._in_flight.get(future)
        if job is None:
            return False
        for running in list(job.running):
            self._engine.cancel(running)
        job.outer.cancel()
        return True

    def _run(self, job: _Rerank, futures: Sequence[Future], then: Callable[[list[GenerationResult]], None]) -> None:
        """Calls `then` with the results of `futures` once all are done; fails the request if one fails."""
        job.running = list(futures)
        if job.outer.done():  # cancelled while the last round finished: this one is not needed
            for future in futures:
                self._engine.cancel(future)
            return
        when_all_done(job.outer, futures, then)

    def _score(self, job: _Rerank, beam: GenerationResult) -> None:
        """Round 2: each candidate translated back, forced to produce the original source."""
        prepared, eos = job.prepared, self._engine.manifest.special_tokens.eos
        source_ids = tuple(prepared.source.ids)  # EOS included
        candidates = beam.nbest  # every beam's candidate: prepare() asked for beam_size sequences
        start = self._engine.manifest.decoder_start[prepared.reverse_language]
        backward = [
            prepared.forcing(source_ids, source=TextSource(tuple(t.id for t in c.tokens) + (eos,)),
                     target_language=prepared.reverse_language, start_id=start, attention_layer=None,
                     timestamp_layer=None, min_new_tokens=0, no_repeat_ngram_size=0, sampling=None,
                     hotwords=None)
            for c in candidates
        ]
        futures = [self._engine.submit_prepared(p, None, None, admitted=True) for p in backward]
        self._run(job, futures, lambda results: self._choose(job, beam, results))

    def _choose(self, job: _Rerank, beam: GenerationResult, backward: list[GenerationResult]) -> None:
        """Ranks the candidates; answers with the winner (round 3 first if it needs its own attention)."""
        prepared, weight = job.prepared, job.prepared.request.decoding.reverse_weight
        ranked = sorted(
            (dataclasses.replace(c, score=c.score + weight * summed_log_prob(b.nbest[0]))
             for c, b in zip(beam.nbest, backward)),
            key=lambda c: -c.score,
        )  # stable: the beam's order breaks ties
        wanted = prepared.request.decoding.num_return_sequences
        nbest = ranked[:wanted] if wanted > 1 else []
        winner = ranked[0]
        if [t.id for t in winner.tokens] == [t.id for t in beam.tokens]:
            self._answer(job, beam, beam, nbest)
            return
        if prepared.attention_layer is None:  # nothing of the winner's own is missing: no third round
            own = dataclasses.replace(beam, text=winner.text, tokens=winner.tokens, finish_reason=winner.finish_reason)
            self._answer(job, beam, own, nbest)
            return
        # Forced as it ended: with its EOS, or cut at the length limit.
        ids = tuple(t.id for t in winner.tokens)
        if winner.finish_reason is FinishReason.EOS:
            ids += (self._engine.manifest.special_tokens.eos,)
        # The request's own rules stay: the beam's log-probabilities were taken under them.
        future = self._engine.submit_prepared(prepared.forcing(ids), None, None, admitted=True)
        self._run(job, [future], lambda results: self._answer(job, beam, results[0], nbest))

    def _answer(self, job: _Rerank, beam: GenerationResult, result: GenerationResult,
                nbest: list[ScoredSequence]) -> None:
        """The winner's result with the reranked n best, timed from the request's acceptance (the rounds
        after the beam search count as decoding)."""
        total = time.perf_counter() - job.started
        timings = dataclasses.replace(beam.timings, total_seconds=total,
                                      decode_seconds=beam.timings.decode_seconds + total - beam.timings.total_seconds)
        settle(job.outer, dataclasses.replace(result, timings=timings, nbest=nbest))
