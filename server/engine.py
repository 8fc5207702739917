"""A served model: validation, batching and decoding behind one object; and the registry of all of them.

`ModelEngine.submit` validates on the caller's thread (bad input raises before anything is queued; the
input kind's preprocessor decodes the input there too) and returns a future; the model's batcher thread
runs the ONNX Runtime calls and resolves it, streaming each token (with its attention row) to an optional
callback on the way. `ModelEngine.cancel` ends a request early: a queued one never runs, a running one
leaves its batch after the current decode step. The worker runs server/continuous.py's loop (continuous
batching, `BatchingOptions.continuous`, the default) or, with `continuous=None`, windowed batches through
`_process`; both build results with this engine's methods.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import pathlib
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError, Future

import numpy as np

from attnserve.server import limits, preprocessing, search_options
from attnserve.server.attention import attention_matrix, combine_heads
from attnserve.server.batcher import Batcher, BatchingOptions, WorkItem
from attnserve.server.continuous import ContinuousLoop
from attnserve.server.decoding import Batch, Hypothesis, PreparedRequest, StepEvents, decode, make_strategy
from attnserve.server.explanation import explain
from attnserve.server.generation import (
    AttentionGranularity,
    GenerationRequest,
    GenerationResult,
    ModelInfo,
    ScoredSequence,
    StreamedToken,
    Timings,
    Token,
    resolved_beam_size,
)
from attnserve.server.ngram_lm import NgramLanguageModel
from attnserve.server.repository import ModelVersion, find_models, open_runtime
from attnserve.server.reranking import Reranker
from attnserve.server.runtime import Runtime, RuntimeOptions
from attnserve.server.tokenization import Tokenizer, check_text

log = logging.getLogger(__name__)

# Widest beam a request may ask for: every beam is a batch row, so this also bounds a request's cost.


@dataclasses.dataclass
class _Clock:
    """perf_counter() readings shared by the requests of one batch."""

    start: float  # the batch's first model call
    encoded: float  # encoder done, first decode step starts
    first_step: float | None = None  # first decode step done


class ModelEngine:
    """One model version: its tokenizer, input preprocessor, ONNX Runtime sessions and dynamic batcher.

    Args:
        model: the repository's version folder and manifest.
        runtime: the model's sessions (already checked against the manifest).
        tokenizer: the model's tokenizer (of its output; text models read their input with it too).
        batching: batching mode, batch size, window and queue bound of this model's batcher.
        preprocessor: reads the model's input kind; None = the one its manifest names.
    """

    def __init__(
        self,
        model: ModelVersion,
        runtime: Runtime,
        tokenizer: Tokenizer,
        batching: BatchingOptions = BatchingOptions(),
        preprocessor: preprocessing.Preprocessor | None = None,
    ):
        self.model = model
        self.manifest = model.manifest
        self.runtime = runtime
        self.tokenizer = tokenizer
        self.preprocessor = preprocessor or preprocessing.create(self.manifest, tokenizer)
        self.language_model = _open_language_model(model, runtime)
        self._eos = self.manifest.special_tokens.eos
        self._max_attention_values = batching.max_attention_values
        self._max_beam_size = batching.max_beam_size
        # The manifest's default search, within what this server accepts.
        self._default_beam_size = min(self.manifest.decoding.beam_size, self._max_beam_size)
        self._continuous = ContinuousLoop(self) if batching.continuous is not None else None
        loop = self._continuous.run if self._continuous is not None else None
        self._batcher = Batcher(self._process, batching, name=self.manifest.name, loop=loop)
        self._reranker = Reranker(self)

    @property
    def providers(self) -> list[str]:
        """The ONNX Runtime execution providers its graphs run on, best first."""
        return self.runtime.providers

    @functools.cached_property
    def info(self) -> ModelInfo:
        m = self.manifest
        info = ModelInfo(
            name=m.name,
            version=m.version,
            task=m.task,
            description=m.description,
            source_languages=list(m.source_languages),
            target_languages=list(m.target_languages),
            max_source_tokens=0,  # the preprocessor's to say, with the other input limits
            max_new_tokens=m.limits.max_new_tokens,
            attention_layers=m.attention.layers,
            attention_heads=m.attention.heads,
            variant=self.runtime.variant,
            max_text_chars=self.max_text_chars or 0,
            max_beam_size=self._max_beam_size,
            default_beam_size=self._default_beam_size,
        )
        info = self.preprocessor.describe(info)
        wire = limits.request_bytes(limits.input_bytes(info, self.max_text_chars))
        return dataclasses.replace(info, max_request_bytes=wire, max_attention_values=self._max_attention_values,
                                   max_response_bytes=limits.MessageLimits.send_bytes)

    @property
    def max_text_chars(self) -> int | None:
        """Text models: the longest text the preprocessor reads (every piece covers at most
        `max_piece_chars` characters); None for other input kinds. Sizes the server's message limits."""
        if self.manifest.input.kind != "text":
            return None
        return self.manifest.limits.max_source_tokens * self.tokenizer.max_piece_chars

    def prepare(self, request: GenerationRequest) -> PreparedRequest:
        """Validates the request's options, then has the preprocessor decode and validate its input.

        Raises:
            ValueError: unknown model or target language, out-of-range max_new_tokens, beam_size, search
                options (server/search_options.py) or attention layer; or an input that is missing, of
                another kind, empty or unusable.
            InputTooLargeError: an input over a limit the model states (audio duration, bytes).
            NotImplementedError: an input kind the server cannot decode.
        """
        m = self.manifest
        if request.model and request.model != m.name:
            raise ValueError(f"request for model '{request.model}' sent to model '{m.name}'")
        language = request.target_language or m.target_languages[0]
        if language not in m.decoder_start:
            supported = ", ".join(m.target_languages)
            raise ValueError(f"unknown target language '{language}' for model '{m.name}'; supported: {supported}")
        max_new_tokens = self._max_new_tokens(request.decoding.max_new_tokens)
        beam_size = resolved_beam_size(request.decoding, self._default_beam_size)
        if not 1 <= beam_size <= self._max_beam_size:
            raise ValueError(f"beam_size {beam_size} is out of range: use 1 (greedy) to {self._max_beam_size}")
        search_options.check_search(dataclasses.replace(request.decoding, beam_size=beam_size), max_new_tokens)
        layer = self._attention_layer(request) if request.attention.enabled else None
        heads = self._attention_heads(request) if request.attention.enabled else ()
        if request.text:
            check_text(request.text)
        timestamp_layer = self.manifest.attention.default_layer % self.manifest.attention.layers
        timestamp_layer = timestamp_layer if self.preprocessor.times_words else None
        # Last: decoding the input is the costly check (tokenizing, WAV decoding, features).
        source = self.preprocessor.prepare(request)
        budget = self.preprocessor.output_budget(source)
        max_new_tokens = max_new_tokens if budget is None else min(max_new_tokens, budget)
        if layer is not None:
            self._check_attention_values(max_new_tokens, source.length, request.decoding.num_return_sequences)
        reverse = self._reverse_language(language) if request.decoding.reverse_weight > 0 else None
        return PreparedRequest(
            request=request,
            source=source,
            target_language=language,
            start_id=m.decoder_start[language],
            max_new_tokens=max_new_tokens,
            beam_size=beam_size,
            attention_layer=layer,
            timestamp_layer=timestamp_layer,
            # Reranking needs every beam's candidate.
            num_return_sequences=beam_size if reverse else request.decoding.num_return_sequences,
            min_new_tokens=request.decoding.min_new_tokens,
            no_repeat_ngram_size=request.decoding.no_repeat_ngram_size,
            sampling=search_options.with_seed(request.decoding.sampling),
            attention_heads=heads,
            attention_reduction=request.attention.reduction,
            reverse_language=reverse,
        )

    def _reverse_language(self, target: str) -> str:
        """The language a reranked request's source is in: the one other language the model translates into
        and reads (reranking translates the candidates back into it)."""
        m = self.manifest
        others = [x for x in m.target_languages if x != target and x in m.source_languages]
        if m.input.kind != "text" or len(others) != 1:
            raise ValueError(
                f"reverse_weight needs a text model that translates between two languages, both ways; model "
                f"'{m.name}' reads {m.input.kind} and writes {', '.join(m.target_languages)}"
            )
        return others[0]

    def _check_attention_values(self, max_new_tokens: int, columns: int, sequences: int) -> None:
        """Refuses attention that could outgrow the server's per-response limit, before any decoding."""
        cap, sequences = self._max_attention_values, max(sequences, 1)
        worst = max_new_tokens * columns * sequences
        if cap and worst > cap:
            times = f" x {sequences} sequences" if sequences > 1 else ""
            raise ValueError(
                f"attention for up to {max_new_tokens} new tokens x {columns} source columns{times} = {worst:,} "
                f"values is over this server's --max-attention-values {cap:,}; ask for fewer max_new_tokens, "
                "fewer sequences, or no attention"
            )

    def _max_new_tokens(self, asked: int) -> int:
        limit = self.manifest.limits.max_new_tokens
        if asked == 0:
            return limit
        if not 1 <= asked <= limit:
            raise ValueError(
                f"max_new_tokens {asked} is out of range: use 1..{limit}, or 0 for the model's default ({limit})"
            )
        return asked

    def _attention_layer(self, request: GenerationRequest) -> int:
        layers, layer = self.manifest.attention.layers, request.attention.layer
        if layer is None:
            layer = self.manifest.attention.default_layer
        if not -layers <= layer < layers:
            raise ValueError(
                f"attention layer {layer} is out of range: model '{self.manifest.name}' has {layers} decoder "
                f"layers ({_index_range(layers)})"
            )
        return layer % layers

    def _attention_heads(self, request: GenerationRequest) -> tuple[int, ...]:
        heads, asked = self.manifest.attention.heads, request.attention.heads
        bad = [h for h in asked if not -heads <= h < heads]
        if bad:
            raise ValueError(
                f"attention heads {bad} are out of range: model '{self.manifest.name}' has {heads} heads per layer "
                f"({_index_range(heads)})"
            )
        chosen = tuple(h % heads for h in asked)
        if len(set(chosen)) != len(chosen):
            raise ValueError(f"attention heads {list(asked)} name a head twice")
        return chosen

    def submit(
        self,
        request: GenerationRequest,
        on_token: Callable[[StreamedToken], None] | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> Future[GenerationResult]:
        """Validates the request, then queues it.

        Args:
            on_token: called from the model's worker thread with each output token, in order, as soon as
                it is known (greedy: every step; beam search: all at once, from the final hypothesis,
                when the request finishes), with its attention row when the request asked for attention.
                If it raises, the request fails with that exception and leaves its batch.
            on_start: called from the worker thread when the request leaves the queue to be encoded
                (its future is running from then on).

        Raises:
            ValueError: see prepare() and submit_prepared(); OverloadedError: the queue is full;
                UnavailableError: closing.
        """
        return self.submit_prepared(self.prepare(request), on_token, on_start)

    def submit_prepared(
        self,
        prepared: PreparedRequest,
        on_token: Callable[[StreamedToken], None] | None = None,
        on_start: Callable[[], None] | None = None,
        admitted: bool = False,
    ) -> Future[GenerationResult]:
        """Queues a request `prepare` has validated (see submit()); `admitted`: a follow-up of a request
        already accepted (reranking's rounds), never refused for a full queue.

        Raises:
            ValueError: a reranked request (reverse_weight) with on_token: its output is known only once
                every candidate was scored. OverloadedError: the queue is full; UnavailableError: closing.
        """
        if prepared.reverse_language is None:
            return self._batcher.submit(prepared, on_token, on_start, admitted=admitted)
        if on_token is not None:
            raise ValueError("a request with reverse_weight cannot be streamed: its output is chosen only after "
                             "every candidate was scored; use Generate, or reverse_weight 0")
        return self._reranker.submit(prepared, on_start)

    def cancel(self, future: Future[GenerationResult]) -> None:
        """Cancels a request `submit` returned `future` for; a no-op once it has finished.

        A queued request is dropped (its future is cancelled). A running one stops streaming after the
        current decode step, its future ends with CancelledError and its batch rows are freed at the next
        step; the other requests of its batch are unaffected. Safe to call from any thread.
        """
        if not self._reranker.cancel(future):
            self._batcher.cancel(future)

    def generate(self, request: GenerationRequest, timeout: float | None = None) -> GenerationResult:
        """Blocking submit(): waits for the result (TimeoutError after `timeout` seconds, which cancels it)."""
        future = self.submit(request)
        try:
            return future.result(timeout)
        finally:
            self.cancel(future)  # a no-op unless the wait timed out

    def running_rows(self) -> int:
        """Batch rows decoding now under continuous batching (beams count one each); 0 otherwise.

        Exact on the worker thread (e.g. in a token callback); a recent value from any other.
        """
        scheduler = self._continuous and self._continuous.scheduler
        return 0 if not scheduler else scheduler.rows

    def queued(self) -> int:
        """Requests waiting for a batch."""
        return self._batcher.queued()

    def close(self, timeout: float | None = None) -> None:
        """Fails queued requests with UnavailableError, finishes the running batch, stops the worker."""
        self._batcher.close(timeout)

    # -- the worker side: everything below runs on the batcher's thread --

    def _process(self, items: Sequence[WorkItem]) -> Iterator[tuple[int, object]]:
        """Runs a batch; requests with different beam sizes decode in separate groups, one after another."""
        groups: dict[int, list[int]] = {}
        for index, item in enumerate(items):
            groups.setdefault(item.payload.beam_size, []).append(index)
        for indices in groups.values():
            yield from self._run_group([items[i] for i in indices], indices)

    def _run_group(self, items: Sequence[WorkItem], indices: Sequence[int]) -> Iterator[tuple[int, object]]:
        prepared = [item.payload for item in items]
        streamed: list[list[int]] = [[] for _ in items]  # ids passed to each item's callback so far
        streaming = np.array([item.on_token is not None for item in items])  # (N,)
        answered: set[int] = set()
        # Encode once for the whole group.
        clock = _Clock(start=time.perf_counter(), encoded=0.0)
        batch = Batch.build(self.manifest, self.runtime, self.preprocessor.collate([p.source for p in prepared]),
                            self.language_model)
        clock.encoded = time.perf_counter()
        strategy = make_strategy(prepared, self.manifest.special_tokens.eos, batch.length_budget)

        def leave(i: int, error: BaseException) -> tuple[int, BaseException]:
            """Answers request i with `error`; its rows leave the batch at the next step."""
            strategy.cancel(i)
            answered.add(i)
            return indices[i], error

        try:
            # Step until every row is done; answer each request in the step it finishes or leaves.
            for events in decode(batch, strategy):
                clock.first_step = clock.first_step or time.perf_counter()
                for i, error in self._stream(items, events, streaming, streamed):
                    yield leave(i, error)
                for hyp in events.finished:
                    if hyp.index not in answered:
                        answered.add(hyp.index)
                        yield indices[hyp.index], self._answer(items[hyp.index], hyp, streamed, clock, len(items))
                # Checked last, just before the next step, so that a cancel made while this step ran (or
                # by a callback just now) counts at once: the strategy drops the rows at the next step.
                for i in [i for i, item in enumerate(items) if item.cancelled and i not in answered]:
                    yield leave(i, CancelledError("the caller cancelled the request"))
        finally:
            # Release the batch's tensors and the decode history now, not when the generator is collected.
            del batch, strategy

    def _stream(
        self, items: Sequence[WorkItem], events: StepEvents, streaming: np.ndarray, streamed: list[list[int]]
    ) -> list[tuple[int, Exception]]:
        """Passes this step's tokens to the callbacks that want them; returns the callbacks that raised."""
        failed = []
        for e in np.flatnonzero(streaming[events.requests]):  # only rows with a callback cost Python work
            i, token_id = int(events.requests[e]), int(events.token_ids[e])
            token = Token(self.tokenizer.pieces([token_id])[0], token_id, float(events.logprobs[e]))
            step = None if events.attention is None else events.attention[e, None]  # (1, L, H, S)
            rows = _piece_rows(items[i].payload, step)
            try:
                text = self.tokenizer.text_delta(streamed[i], token_id)
                items[i].emit(StreamedToken(len(streamed[i]), token, None if rows is None else rows[0], text))
                streamed[i].append(token_id)
            except Exception as exc:  # the caller's callback: fail this request only
                failed.append((i, exc))
        return failed

    def _answer(
        self, item: WorkItem, hyp: Hypothesis, streamed: list[list[int]], clock: _Clock, size: int
    ) -> object:
        """The finished request's result, or the exception that failed it."""
        try:
            result = self._result(item.payload, hyp, clock, item.accepted_at, size)
        except Exception as exc:
            log.exception("request %r failed while building its result", item.payload.request.request_id)
            return exc
        try:
            _stream_rest(item, hyp, result.tokens, len(streamed[hyp.index]), self.tokenizer)
        except Exception as exc:  # the caller's callback: fail this request only
            return exc
        return result

    def _result(
        self, prepared: PreparedRequest, hyp: Hypothesis, clock: _Clock, accepted: float, size: int
    ) -> GenerationResult:
        tok = self.tokenizer
        ids = hyp.token_ids.tolist()
        pieces = tok.pieces(ids)
        tokens = [Token(p, i, lp) for p, i, lp in zip(pieces, ids, hyp.logprobs.tolist())]
        source_tokens = self.preprocessor.source_tokens(prepared.source)  # one per attention column
        attention = None
        if prepared.attention_layer is not None:
            words = prepared.request.attention.granularity is AttentionGranularity.WORDS
            row_words = tok.words(ids) if words else None
            col_words = self.preprocessor.source_words(prepared.source) if words else None
            columns = [t.piece for t in source_tokens]
            attention = attention_matrix(hyp.attention, prepared.attention_layer, pieces, columns, row_words, col_words,
                                         prepared.attention_heads, prepared.attention_reduction)
            # The source's end token (last column, at either granularity) is never an omission.
            ends = [len(attention.col_labels) - 1] if source_tokens and source_tokens[-1].id == self._eos else []
            explanation = explain(attention.weights, len(attention.col_labels), ends)
            attention = dataclasses.replace(attention, explanation=explanation)
        words = []
        if prepared.timestamp_layer is not None:
            rows = combine_heads(hyp.attention, prepared.timestamp_layer)  # (R, S): mean of every head
            words = self.preprocessor.word_timings(prepared.source, rows, pieces, tok.words(ids))
        done = time.perf_counter()
        timings = Timings(
            queue_seconds=clock.start - accepted,
            encode_seconds=clock.encoded - clock.start,
            first_token_seconds=(clock.first_step or done) - accepted,
            decode_seconds=done - clock.encoded,
            total_seconds=done - accepted,
            batch_size=size,
        )
        return GenerationResult(
            model=self.manifest.name,
            text=tok.decode(ids),
            target_language=prepared.target_language,
            tokens=tokens,
            source_tokens=source_tokens,
            finish_reason=hyp.finish_reason,
            attention=attention,
            timings=timings,
            words=words,
            nbest=self._nbest(prepared, hyp),
            frames=self.preprocessor.frame_attention(prepared.source, attention) if attention is not None else [],
        )

    def _nbest(self, prepared: PreparedRequest, hyp: Hypothesis) -> list[ScoredSequence]:
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


def _index_range(count: int) -> str:
    """How an index into `count` things may be written: from the first, or negative from the last."""
    return f"use 0..{count - 1}, or -{count}..-1 counting from the last"


def _piece_rows(prepared: PreparedRequest, weights: np.ndarray | None) -> list[list[float]] | None:
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
    rows = _piece_rows(item.payload, hyp.attention)
    ids = [t.id for t in tokens]
    for index in range(start, len(tokens)):
        text = tokenizer.text_delta(ids[:index], ids[index])
        item.emit(StreamedToken(index, tokens[index], None if rows is None else rows[index], text))


class EngineRegistry:
    """The engines of every model in a repository, by name."""

    def __init__(self, engines: dict[str, ModelEngine]):
        self._engines = dict(engines)

    def get(self, name: str) -> ModelEngine:
        """The engine serving `name`.

        Raises:
            ValueError: no such model (the message lists the available ones).
        """
        try:
            return self._engines[name]
        except KeyError:
            available = ", ".join(sorted(self._engines)) or "none"
            raise ValueError(f"unknown model '{name}'; available: {available}") from None

    def names(self) -> list[str]:
        return sorted(self._engines)

    def infos(self) -> list[ModelInfo]:
        return [self._engines[name].info for name in self.names()]

    def __contains__(self, name: str) -> bool:
        return name in self._engines

    def __len__(self) -> int:
        return len(self._engines)

    def __iter__(self):
        return iter(self.names())

    def close(self, timeout: float | None = None) -> None:
        for engine in self._engines.values():
            engine.close(timeout)


def _logit_classes(model: ModelVersion, runtime: Runtime) -> int | str | None:
    """How many classes the decoder's logits have: a size, or the symbolic name of a dynamic axis."""
    return runtime.decoder_signature.outputs[model.manifest.decoder.logits].shape[-1]


def _open_language_model(model: ModelVersion, runtime: Runtime) -> NgramLanguageModel | None:
    """The manifest's LM for shallow fusion, or None.

    Raises:
        ValueError: the file is unreadable, or its vocabulary is not the decoder's.
    """
    spec = model.manifest.language_model
    if spec is None:
        return None
    lm = NgramLanguageModel.load(model.path / spec.file)
    classes = _logit_classes(model, runtime)
    if isinstance(classes, int) and classes != lm.vocab_size:
        raise ValueError(f"{model.path / spec.file}: the language model scores {lm.vocab_size} tokens, the decoder "
                         f"{classes}")
    return lm


def load_engine(
    model: ModelVersion,
    runtime_options: RuntimeOptions = RuntimeOptions(),
    batching: BatchingOptions = BatchingOptions(),
) -> ModelEngine:
    """Opens one model version: sessions (checked against the manifest), tokenizer, preprocessor, batcher.

    Raises:
        ValueError: a graph or the tokenizer is broken, or the model can produce ids the tokenizer lacks.
    """
    runtime = open_runtime(model, runtime_options)
    tokenizer = Tokenizer.from_manifest(model.path, model.manifest)
    classes = _logit_classes(model, runtime)
    if isinstance(classes, int) and classes > tokenizer.vocab_size:
        raise ValueError(
            f"{model.decoder_path}: logits have {classes} classes but {model.tokenizer_path} has only "
            f"{tokenizer.vocab_size} tokens"
        )
    return ModelEngine(model, runtime, tokenizer, batching)


def load_engines(
    repository_path: str | pathlib.Path,
    runtime_options: RuntimeOptions = RuntimeOptions(),
    batching_options: BatchingOptions = BatchingOptions(),
    broken: dict[str, str] | None = None,
    only: Sequence[str] = (),
) -> EngineRegistry:
    """Loads the newest version of every model in a repository.

    Args:
        broken: None = one broken model fails them all; a dict = broken models are skipped and recorded
            here (name -> the reason, naming the file).
        only: load these models alone; empty = every model.

    Raises:
        ValueError: the repository or (without `broken`) a model in it is broken (the message names the
            file); engines already started are closed first.
    """
    engines: dict[str, ModelEngine] = {}
    try:
        for name, model in find_models(repository_path, broken, only).items():
            try:
                engines[name] = load_engine(model, runtime_options, batching_options)
            except ValueError as exc:
                if broken is None:
                    raise
                broken[name] = str(exc)
    except BaseException:
        EngineRegistry(engines).close()
        raise
    return EngineRegistry(engines)
