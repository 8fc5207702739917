"""A served model: validation, queueing and cancelling behind one object.

`ModelEngine.submit` validates on the caller's thread (server/engine/validation.py: bad input raises before
anything is queued; the input kind's preprocessor decodes the input there too) and returns a future; the
model's batcher thread runs the ONNX Runtime calls and resolves it, streaming each token (with its attention
row) to an optional callback on the way. `ModelEngine.cancel` ends a request early: a queued one never runs,
a running one leaves its batch after the current decode step.

The worker runs server/engine/continuous.py's loop (continuous batching, `BatchingOptions.continuous`, the
default) or, with `continuous=None`, server/engine/windowed.py's windowed batches; both are handed the model's
`ModelHandle` (encode, search) and its `ResultBuilder` (server/engine/results.py), never the engine. Opening
models and the registry of all of them are server/engine/registry.py's.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from concurrent.futures import Future

from attnserve.server.decoding import glossary
from attnserve.server.engine import limits
from attnserve.server.inputs import preprocessing, preprocessors
from attnserve.server.engine.batcher import Batcher, BatchingOptions
from attnserve.server.engine.continuous import ContinuousLoop
from attnserve.server.decoding.glossary import Glossary
from attnserve.api.generation import GenerationRequest, GenerationResult, ModelInfo, StreamedToken
from attnserve.server.engine.model_handle import ModelHandle
from attnserve.server.decoding.prepared import PreparedRequest
from attnserve.server.model.repository import ModelVersion
from attnserve.server.engine.reranking import Reranker
from attnserve.server.engine.speed_readings import SpeedReadings
from attnserve.server.decoding.word_lm import WordLanguageModel, WordRescorer
from attnserve.server.engine.results import ResultBuilder
from attnserve.server.model.runtime import Runtime
from attnserve.server.model.tokenization import Tokenizer
from attnserve.server.engine.validation import RequestValidator
from attnserve.server.engine.windowed import WindowedBatches


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
        self.preprocessor = preprocessor or preprocessors.create(self.manifest, tokenizer)
        self.glossary = Glossary(glossary.read_file(model.path.parent / glossary.FILE), tokenizer,
                                 self.manifest.special_tokens.unk, self.manifest.input.kind == "text")
        self._validator = RequestValidator(self.manifest, self.preprocessor, batching.max_beam_size,
                                           batching.max_attention_values, self.glossary, tokenizer)
        handle = ModelHandle.open(model, runtime, self.preprocessor)
        results = ResultBuilder(self.manifest, tokenizer, self.preprocessor)
        self._continuous = ContinuousLoop(handle, results) if batching.continuous is not None else None
        loop = self._continuous.run if self._continuous is not None else None
        self._batcher = Batcher(WindowedBatches(handle, results), batching, name=self.manifest.name, loop=loop)
        self._reranker = Reranker(self)
        self._readings = SpeedReadings(self, self.manifest.decoding.speeds, _word_rescorer(model))
        # The server's callback for an engine that ends on its own (service.Engine); this one never does.
        self.on_exit: Callable[[str], None] | None = None

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
            max_beam_size=self._validator.max_beam_size,
            default_beam_size=self._validator.default_beam_size,
        )
        info = self.preprocessor.describe(info)
        wire = limits.request_bytes(limits.input_bytes(info, self.max_text_chars))
        return dataclasses.replace(info, max_request_bytes=wire, max_attention_values=self._validator.max_attention_values,
                                   max_response_bytes=limits.MessageLimits.send_bytes,
                                   glossary_terms=len(self.glossary.default))

    @property
    def max_text_chars(self) -> int | None:
        """Text models: the longest text the preprocessor reads (every piece covers at most
        `max_piece_chars` characters); None for other input kinds. Sizes the server's message limits."""
        if self.manifest.input.kind != "text":
            return None
        return self.manifest.limits.max_source_tokens * self.tokenizer.max_piece_chars

    def prepare(self, request: GenerationRequest) -> PreparedRequest:
        """Validates the request and preprocesses its input (see RequestValidator.prepare)."""
        return self._validator.prepare(request)

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
        already accepted (reranking's rounds, speed readings), never refused for a full queue. An audio request
        whose manifest names `decoding.speeds` is read at each (server/engine/speed_readings.py).

        Raises:
            ValueError: a reranked request (reverse_weight) with on_token: its output is known only once
                every candidate was scored. OverloadedError: the queue is full; UnavailableError: closing.
        """
        if self._readings.applies(prepared):
            return self._readings.submit(prepared, on_token, on_start)
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
        if not self._reranker.cancel(future) and not self._readings.cancel(future):
            self._batcher.cancel(future)

    def generate(self, request: GenerationRequest, timeout: float | None = None) -> GenerationResult:
        """Blocking submit(): waits for the result (TimeoutError after `timeout` seconds, which cancels it)."""
        future = self.submit(request)
        try:
            return future.result(timeout)
        finally:
            self.cancel(future)  # a no-op unless the wait timed out

    @property
    def max_rows(self) -> int | None:
        """Continuous batching's bound on rows decoding at once (--max-rows); None for windowed batches."""
        continuous = self._batcher.options.continuous
        return None if continuous is None else continuous.max_rows

    def queued(self) -> int:
        """Requests waiting for a batch."""
        return self._batcher.queued()

    def close(self, timeout: float | None = None) -> None:
        """Fails queued requests with UnavailableError, finishes the running batch, stops the worker."""
        self._batcher.close(timeout)


def _word_rescorer(model: ModelVersion) -> WordRescorer | None:
    """The manifest's word LM, loaded, as the rescorer of its candidates; None when it names none.

    Raises:
        ValueError: the LM file is unreadable (the message names it).
    """
    spec = model.manifest.word_language_model
    if spec is None:
        return None
    return WordRescorer(WordLanguageModel.load(model.path / spec.file), spec.weight, spec.word_bonus,
                        spec.unknown_penalty)
