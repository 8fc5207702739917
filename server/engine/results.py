"""Result assembly: what a request gets back, built from what the decode loop produced.

Two moments of a request meet here. Each decode step, `ResultBuilder.stream` turns the step's tokens into
`StreamedToken`s for the requests that stream (greedy rows only: beam search streams nothing while it
searches). When a request finishes, `ResultBuilder.answer` turns its `Hypothesis` into a `GenerationResult`
(text, tokens, attention at the asked granularity with its explanation, word timings, the n best) and
streams whatever the request had not streamed yet. A `BatchClock`, shared by the requests encoded
together, times both.

Both worker loops (server/engine/continuous.py and server/engine/windowed.py) use this one builder, so a result is the
same whichever loop decoded it. Nothing here calls a model.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

import numpy as np

from attnserve.server.decoding import glossary
from attnserve.server.attention.alignment import alignment_rows
from attnserve.server.attention.attention import attention_matrix, combine_heads
from attnserve.server.engine.batcher import WorkItem
from attnserve.server.attention.explanation import explain
from attnserve.api.generation import (
    AttentionGranularity,
    GenerationResult,
    ScoredSequence,
    StreamedToken,
    Timings,
    Token,
)
from attnserve.server.model.manifest import Manifest
from attnserve.server.decoding.prepared import PreparedRequest
from attnserve.server.decoding.prompt import detected_language
from attnserve.server.inputs.preprocessing import Preprocessor
from attnserve.server.decoding.search import Hypothesis, StepEvents
from attnserve.server.decoding.word_confidence import word_confidences
from attnserve.server.model.tokenization import Tokenizer

log = logging.getLogger(__name__)


@dataclasses.dataclass
class BatchClock:
    """perf_counter() readings shared by the requests encoded together (one encoder call)."""

    start: float  # the batch's first model call
    encoded: float = 0.0  # encoder done, first decode step starts
    first_step: float | None = None  # first decode step done

    @classmethod
    def started(cls) -> BatchClock:
        """A clock whose batch starts now."""
        return cls(start=time.perf_counter())

    def stepped(self) -> None:
        """Notes that a decode step ended (only the first counts)."""
        self.first_step = self.first_step or time.perf_counter()

    def timings(self, accepted: float, batch_size: int) -> Timings:
        """A request's timings, accepted at `accepted` and done now."""
        done = time.perf_counter()
        return Timings(
            queue_seconds=self.start - accepted,
            encode_seconds=self.encoded - self.start,
            first_token_seconds=(self.first_step or done) - accepted,
            decode_seconds=done - self.encoded,
            total_seconds=done - accepted,
            batch_size=batch_size,
        )


class ResultBuilder:
    """Builds one model's streamed tokens and results.

    Args:
        manifest: the model's manifest (its name, EOS).
        tokenizer: the model's output tokenizer.
        preprocessor: the model's input preprocessor (attention columns, source words, word timings).
    """

    def __init__(self, manifest: Manifest, tokenizer: Tokenizer, preprocessor: Preprocessor):
        self.manifest = manifest
        self.tokenizer = tokenizer
        self.preprocessor = preprocessor

    def stream(
        self, items: Sequence[WorkItem], events: StepEvents, streaming: np.ndarray, streamed: list[list[int]]
    ) -> list[tuple[int, Exception]]:
        """Passes this step's tokens to the callbacks that want them; returns the callbacks that raised."""
        failed = []
        for e in np.flatnonzero(streaming[events.requests]):  # only rows with a callback cost Python work
            i, token_id = int(events.requests[e]), int(events.token_ids[e])
            token = Token(self.tokenizer.pieces([token_id])[0], token_id, float(events.logprobs[e]))
            step = None if events.attention is None else events.attention[e, None]  # (1, L, H, S)
            rows = piece_rows(items[i].payload, step)
            try:
                text = self.tokenizer.text_delta(streamed[i], token_id)
                items[i].emit(StreamedToken(len(streamed[i]), token, None if rows is None else rows[0], text))
                streamed[i].append(token_id)
            except Exception as exc:  # the caller's callback: fail this request only
                failed.append((i, exc))
        return failed

    def answer(self, item: WorkItem, hyp: Hypothesis, streamed: list[list[int]], clock: BatchClock,
               size: int) -> object:
        """The finished request's result, or the exception that failed it."""
        try:
            result = self.result(item.payload, hyp, clock, item.accepted_at, size)
        except Exception as exc:
            log.exception("request %r failed while building its result", item.payload.request.request_id)
            return exc
        try:
            _stream_rest(item, hyp, result.tokens, len(streamed[hyp.index]), self.tokenizer)
        except Exception as exc:  # the caller's callback: fail this request only
            return exc
        return result

    def result(
        self, prepared: PreparedRequest, hyp: Hypothesis, clock: BatchClock, accepted: float, size: int
    ) -> GenerationResult:
        """The result of a finished hypothesis; `size`: most requests that shared a decoder call with it."""
        tok = self.tokenizer
        ids = hyp.token_ids.tolist()
        pieces = tok.pieces(ids)
        tokens = [Token(p, i, lp) for p, i, lp in zip(pieces, ids, hyp.logprobs.tolist())]
        source_tokens = self.preprocessor.source_tokens(prepared.source)  # one per attention column
        attention = None
        if prepared.attention_layer is not None:
            attention = self._attention(prepared, hyp, ids, pieces, source_tokens)
        words = self._timed_words(prepared, hyp, ids, pieces) if prepared.timestamp_layer is not None else []
        return GenerationResult(
            model=self.manifest.name,
            text=tok.decode(ids),
            target_language=prepared.target_language or detected_language(self.manifest, ids),
            tokens=tokens,
            source_tokens=source_tokens,
            finish_reason=hyp.finish_reason,
            attention=attention,
            timings=clock.timings(accepted, size),
            words=words,
            nbest=self.nbest(prepared, hyp),
            glossary=glossary.placements(prepared.constraints, ids),
            frames=self.preprocessor.frame_attention(prepared.source, attention) if attention is not None else [],
        )

    def _timed_words(self, prepared: PreparedRequest, hyp: Hypothesis, ids: list[int], pieces: list[str]):
        """Word timestamps: by DTW over the manifest's alignment heads (Whisper's), else from the timestamp
        layer's head mean."""
        spec, scale = self.manifest.word_timestamps, self.manifest.decoding.word_confidence_scale
        if spec is None:
            rows = combine_heads(hyp.attention, prepared.timestamp_layer)  # (R, S): mean of every head
            words = self.tokenizer.words(ids)
            return self.preprocessor.word_timings(prepared.source, rows, pieces, words,
                                                  word_confidences(words, pieces, hyp.logprobs, scale))
        prompt = prepared.forced_start.prompt_length if prepared.forced_start else 0
        rows = alignment_rows(hyp.attention, hyp.eos_attention, spec.alignment_heads, prompt)  # (R, K, S)
        timed = slice(prompt, prompt + len(rows))
        words = self.tokenizer.words(ids[timed])
        return self.preprocessor.aligned_word_timings(
            prepared.source, rows, words, self.tokenizer.is_special(ids[timed]), spec.median_filter_width,
            word_confidences(words, pieces[timed], hyp.logprobs[timed], scale))

    def _attention(self, prepared: PreparedRequest, hyp: Hypothesis, ids: list[int], pieces: list[str],
                   source_tokens: list[Token]):
        """The request's attention matrix at its granularity, with the explanation of its columns."""
        words = prepared.request.attention.granularity is AttentionGranularity.WORDS
        row_words = self.tokenizer.words(ids) if words else None
        col_words = self.preprocessor.source_words(prepared.source) if words else None
        columns = [t.piece for t in source_tokens]
        attention = attention_matrix(hyp.attention, prepared.attention_layer, pieces, columns, row_words, col_words,
                                     prepared.attention_heads, prepared.attention_reduction)
        # The source's end token (last column, at either granularity) is never an omission.
        eos = self.manifest.special_tokens.eos
        ends = [len(attention.col_labels) - 1] if source_tokens and source_tokens[-1].id == eos else []
        explanation = explain(attention.weights, len(attention.col_labels), ends)
        return dataclasses.replace(attention, explanation=explanation)

    def nbest(self, prepared: PreparedRequest, hyp: Hypothesis) -> list[ScoredSequence]:
        """The scored best sequences when the request asked for more than one, or the forced output with its
        score (the reranker reads it); else empty."""
        if prepared.num_return_sequences <= 1 and prepared.forced_ids is None:
            return []
        out = []
        for h in (hyp, *hyp.alternatives):
            ids = h.token_ids.tolist()
            tokens = [Token(p, i, lp) for p, i, lp in zip(self.tokenizer.pieces(ids), ids, h.logprobs.tolist())]
            out.append(ScoredSequence(self.tokenizer.decode(ids), tokens, h.score, h.finish_reason))
        return out


def piece_rows(prepared: PreparedRequest, weights: np.ndarray | None) -> list[list[float]] | None:
    """Rows of the request's piece-level attention matrix; None when it asked for no attention.

    Args:
        weights: (n, L, H, S') attention of n output tokens, S' >= the request's S source pieces; None
            when the batch kept no attention.

    Returns:
        n rows of S floats: the chosen layer and heads, combined (attention_matrix's rows at PIECES).
    """
    if prepared.attention_layer is None or weights is None:
        return None
    return combine_heads(weights[..., : prepared.source.length], prepared.attention_layer,
                         prepared.attention_heads, prepared.attention_reduction).tolist()


def _stream_rest(item: WorkItem, hyp: Hypothesis, tokens: Sequence[Token], start: int, tokenizer: Tokenizer) -> None:
    """Streams the tokens from `start` on: beam search streams its whole output when it finishes.

    Raises:
        Whatever the item's callback raises.
    """
    if item.on_token is None or start == len(tokens):
        return
    rows = piece_rows(item.payload, hyp.attention)
    ids = [t.id for t in tokens]
    for index in range(start, len(tokens)):
        text = tokenizer.text_delta(ids[:index], ids[index])
        item.emit(StreamedToken(index, tokens[index], None if rows is None else rows[index], text))
