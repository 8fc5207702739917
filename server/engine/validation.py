"""Request validation: every check a request passes before anything is queued, in one place.

`RequestValidator.prepare` checks a `GenerationRequest` against its model (model name, target language,
max_new_tokens, beam size, attention layer and heads, the attention a response may carry) and its search
options (`check_search`: n-best, sampling, minimum length, repetition guard, reranking), then has the input
kind's preprocessor decode and validate the input, last because it is the costly check. The result is the
`PreparedRequest` the decode loop consumes. Each message names the option, the value sent and what would
be accepted; the gRPC edge reports every one as INVALID_ARGUMENT (an input over a stated limit: OUT_OF_RANGE).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import secrets

from attnserve.api.generation import (DEFAULT_HOTWORD_BOOST, DecodingOptions, GenerationRequest, SamplingOptions,
                                      resolved_beam_size)
from attnserve.server.decoding.glossary import Glossary
from attnserve.server.decoding.hotwords import HotwordBias, Vocabulary, hotword_bias, hotword_vocabulary
from attnserve.api.language_detection import target_for
from attnserve.server.model.manifest import Manifest
from attnserve.server.decoding.prepared import PreparedRequest
from attnserve.server.decoding.prompt import forced_start
from attnserve.server.inputs.preprocessing import Preprocessor
from attnserve.server.model.tokenization import Tokenizer, check_text


class RequestValidator:
    """Checks one model's requests and prepares them for its decode loop.

    Args:
        manifest: the model's manifest (languages, limits, attention shape, default search).
        preprocessor: reads and validates the model's input kind.
        max_beam_size: widest beam this server accepts (every beam is a batch row).
        max_attention_values: most attention weights one response may carry; 0 = no limit.
        glossary: turns the request's glossary terms into constraints (server/decoding/glossary.py); None = none.
        tokenizer: the model's output tokenizer, whose pieces hotwords are matched against
            (server/decoding/hotwords.py), read into a Vocabulary at the first request with hotwords; None =
            the model takes no hotwords.
    """

    def __init__(self, manifest: Manifest, preprocessor: Preprocessor, max_beam_size: int,
                 max_attention_values: int = 0, glossary: Glossary | None = None,
                 tokenizer: Tokenizer | None = None):
        self.manifest = manifest
        self._tokenizer = tokenizer
        self.glossary = glossary
        self.preprocessor = preprocessor
        self.max_beam_size = max_beam_size
        self.max_attention_values = max_attention_values
        # The manifest's default search, within what this server accepts.
        self.default_beam_size = min(manifest.decoding.beam_size, max_beam_size)

    def prepare(self, request: GenerationRequest) -> PreparedRequest:
        """Validates the request's options, then has the preprocessor decode and validate its input.

        Raises:
            ValueError: unknown model or target language, out-of-range max_new_tokens, beam_size, search
                options (`check_search`) or attention layer; or an input that is missing, of
                another kind, empty or unusable.
            InputTooLargeError: an input over a limit the model states (audio duration, bytes).
            NotImplementedError: an input kind the server cannot decode.
        """
        m = self.manifest
        if request.model and request.model != m.name:
            raise ValueError(f"request for model '{request.model}' sent to model '{m.name}'")
        detect = m.detect_language and not request.target_language  # the first step chooses (prompt.py)
        language = request.target_language or ("" if detect else target_for(m.source_languages, m.target_languages, request.text))
        if language not in m.decoder_start and not detect:
            supported = ", ".join(m.target_languages)
            raise ValueError(f"unknown target language '{language}' for model '{m.name}'; supported: {supported}")
        if request.source_language and request.source_language not in m.source_languages:
            raise ValueError(f"unknown source language '{request.source_language}' for model '{m.name}'; "
                             f"supported: {', '.join(m.source_languages)}")
        max_new_tokens = self._max_new_tokens(request.decoding.max_new_tokens)
        beam_size = resolved_beam_size(request.decoding, self.default_beam_size)
        if not 1 <= beam_size <= self.max_beam_size:
            raise ValueError(f"beam_size {beam_size} is out of range: use 1 (greedy) to {self.max_beam_size}")
        check_search(dataclasses.replace(request.decoding, beam_size=beam_size), max_new_tokens)
        layer = self._attention_layer(request) if request.attention.enabled else None
        heads = self._attention_heads(request) if request.attention.enabled else ()
        if request.text:
            check_text(request.text)
        hotwords = self._hotwords(request.decoding) if request.decoding.hotwords else None
        timestamp_layer = self.manifest.attention.default_layer % self.manifest.attention.layers
        timestamp_layer = timestamp_layer if self.preprocessor.times_words else None
        # Last: decoding the input is the costly check (tokenizing, WAV decoding, features).
        source = self.preprocessor.prepare(request)
        budget = self.preprocessor.output_budget(source)
        max_new_tokens = max_new_tokens if budget is None else min(max_new_tokens, budget)
        if layer is not None:
            self._check_attention_values(max_new_tokens, source.length, request.decoding.num_return_sequences)
        reverse = self._reverse_language(language) if request.decoding.reverse_weight > 0 else None
        constraints = self.glossary.constraints(request, max_new_tokens, beam_size) if self.glossary else ()
        return PreparedRequest(
            request=request,
            source=source,
            target_language=language,
            start_id=m.decoder_start[language or m.target_languages[0]],
            forced_start=forced_start(m, language, request.source_language),
            max_new_tokens=max_new_tokens,
            beam_size=beam_size,
            early_stopping=m.decoding.early_stopping,
            attention_layer=layer,
            timestamp_layer=timestamp_layer,
            # Reranking needs every beam's candidate.
            num_return_sequences=beam_size if reverse else request.decoding.num_return_sequences,
            min_new_tokens=request.decoding.min_new_tokens,
            no_repeat_ngram_size=request.decoding.no_repeat_ngram_size,
            sampling=with_seed(request.decoding.sampling),
            attention_heads=heads,
            attention_reduction=request.attention.reduction,
            reverse_language=reverse,
            constraints=constraints,
            hotwords=hotwords,
        )

    @functools.cached_property
    def _vocabulary(self) -> Vocabulary:
        # Built when first needed: most requests name no hotwords, and a vocabulary can hold 256k pieces.
        return hotword_vocabulary(self._tokenizer)

    def _hotwords(self, options: DecodingOptions) -> HotwordBias:
        if self._tokenizer is None:
            raise ValueError(f"model '{self.manifest.name}' takes no hotwords")
        boost = options.hotword_boost or DEFAULT_HOTWORD_BOOST
        return hotword_bias(options.hotwords, boost, self._vocabulary, self.manifest.name)

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
        cap, sequences = self.max_attention_values, max(sequences, 1)
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


def check_search(options: DecodingOptions, max_new_tokens: int) -> None:
    """Raises ValueError naming the first option out of range or the first conflict.

    Args:
        options: the request's options; its beam_size already checked.
        max_new_tokens: the request's resolved token limit.
    """
    n, beams = options.num_return_sequences, options.beam_size
    if not 1 <= n <= beams:
        raise ValueError(
            f"num_return_sequences {n} is out of range: use 1..{beams} (at most beam_size, {beams}); "
            f"raise beam_size for more"
        )
    if not 0 <= options.min_new_tokens <= max_new_tokens:
        raise ValueError(
            f"min_new_tokens {options.min_new_tokens} is out of range: use 0..{max_new_tokens} "
            f"(at most max_new_tokens)"
        )
    if options.no_repeat_ngram_size < 0:
        raise ValueError(f"no_repeat_ngram_size {options.no_repeat_ngram_size} is out of range: use 0 (off) or more")
    if options.sampling is not None:
        _check_sampling(options.sampling, beams)
    w = options.reverse_weight
    if not (math.isfinite(w) and w >= 0):
        raise ValueError(f"reverse_weight {w} is out of range: use 0 (off) or a number > 0 (0.1 is a good start)")
    if w > 0 and beams < 2:  # sampling, refused above unless beam_size is 1, is caught here too
        raise ValueError(
            f"reverse_weight reranks a beam's candidates: use beam_size 2 or more (got {beams}) and no sampling"
        )


def _check_sampling(sampling: SamplingOptions, beams: int) -> None:
    if beams != 1:
        raise ValueError(
            f"sampling and beam search do not combine: beam_size is {beams}; use beam_size 1 to sample, "
            f"or leave sampling unset to search"
        )
    t = sampling.temperature
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"temperature {t} is out of range: use a number > 0 (1 = the model's distribution)")
    if sampling.top_k < 0:
        raise ValueError(f"top_k {sampling.top_k} is out of range: use 0 (no limit) or more")
    p = sampling.top_p
    if not (math.isfinite(p) and 0 < p <= 1):
        raise ValueError(f"top_p {p} is out of range: use a number in (0, 1] (1 = every token)")
    if sampling.seed is not None and not 0 <= sampling.seed < 2**64:
        raise ValueError(f"seed {sampling.seed} is out of range: use 0..2**64-1")


def with_seed(sampling: SamplingOptions | None) -> SamplingOptions | None:
    """The sampling options with a seed: the request's own, or a fresh random one."""
    if sampling is None or sampling.seed is not None:
        return sampling
    return dataclasses.replace(sampling, seed=secrets.randbits(64))


def _index_range(count: int) -> str:
    """How an index into `count` things may be written: from the first, or negative from the last."""
    return f"use 0..{count - 1}, or -{count}..-1 counting from the last"
