"""One preprocessor per input kind: everything the server knows about what a model reads.

The decode loop, the batcher, beam search and attention aggregation never ask what a model reads. A
`Preprocessor` owns all of it, for one kind (the manifest's `input.kind`):

  prepare()        the request's raw input -> a `Source`: decoded and validated (ValueError for bad input,
                   InputTooLargeError past a stated limit), on the submitting thread, before anything is queued;
  collate()        the sources decoded together -> the encoder's feeds, padded along their sequence axis, with
                   masks, and each row's number of encoder positions (its attention columns);
  source_tokens()  one label per attention column (text: pieces; audio: time spans; images: grid cells);
  source_words()   how columns group at word granularity (text: words; other kinds: each column alone);
  word_timings()   each output word's time span, read from its attention (audio only);
  frame_attention() each output row's attention per frame and on its peak frame (video only);
  describe()       the kind and limits a client reads in ModelInfo.

Text lives here; audio (server/inputs/audio.py), images (server/inputs/image.py) and video (server/inputs/video.py) each have their
own module, so a new input kind is one new module, its spec for the manifest's `input` (server/inputs/inputs.py) and a line in
server/inputs/preprocessors.py, which picks a model's preprocessor by its kind.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import ClassVar, Protocol

import numpy as np

from attnserve.api.generation import (
    AttentionMatrix,
    FrameAttention,
    GenerationRequest,
    InputKind,
    ModelInfo,
    Token,
    WordTiming,
)
from attnserve.server.model.manifest import Manifest
from attnserve.server.model.tokenization import Tokenizer, Words


class Source(Protocol):
    """One request's input, ready for the encoder; each kind has its own dataclass."""

    @property
    def length(self) -> int:
        """Encoder positions this source gives: the columns of its attention matrix."""


@dataclasses.dataclass(frozen=True)
class EncoderBatch:
    """What one encoder call of several requests gets, and where each row's real positions end."""

    # Encoder graph input name -> (B, ...) tensor, padded where sources differ in length.
    feeds: dict[str, np.ndarray]
    # (B,) encoder positions (attention columns) of each row; the rest of its source axis is padding.
    lengths: np.ndarray


def pad_batch(arrays: Sequence[np.ndarray], value: float, multiple: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Right-pads arrays along their first axis into one batch.

    Args:
        arrays: (L_i, ...) per row, equal in every axis but the first, one dtype.
        value: what padding holds.
        multiple: the padded length is rounded up to a multiple of this.

    Returns:
        (B, L, ...) padded batch and (B, L) int64 mask, 1 on real positions.
    """
    lengths = np.array([len(a) for a in arrays], dtype=np.int64)  # (B,)
    width = int(lengths.max()) if len(arrays) else 0
    width = -(-width // multiple) * multiple
    tail = arrays[0].shape[1:] if len(arrays) else ()
    dtype = arrays[0].dtype if len(arrays) else np.float32
    batch = np.full((len(arrays), width, *tail), value, dtype=dtype)
    for row, a in enumerate(arrays):
        batch[row, : len(a)] = a
    mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)  # (B, L)
    return batch, mask


class Preprocessor(abc.ABC):
    """Turns one input kind into encoder feeds and attention-column labels (see the module docstring).

    Args:
        manifest: the model's manifest; `manifest.input` is this kind's spec.
        tokenizer: the model's tokenizer (of its output; text models read their input with it too).
    """

    kind: ClassVar[InputKind]
    # Whether the input has time, so that output words get timestamps (word_timings()).
    times_words: ClassVar[bool] = False

    def __init__(self, manifest: Manifest, tokenizer: Tokenizer | None):
        self.manifest = manifest
        self.tokenizer = tokenizer

    @abc.abstractmethod
    def prepare(self, request: GenerationRequest) -> Source:
        """Decodes and validates the request's input.

        Raises:
            ValueError: the request carries no input of this kind, or the input is unusable.
            InputTooLargeError: the input exceeds a limit stated in ModelInfo.
            NotImplementedError: this kind of input cannot be decoded yet.
        """

    @abc.abstractmethod
    def collate(self, sources: Sequence[Source]) -> EncoderBatch:
        """The encoder feeds for `sources` decoded as one batch (one row each, in order)."""

    @abc.abstractmethod
    def source_tokens(self, source: Source) -> list[Token]:
        """One token per attention column: its label as `piece`, and its vocabulary id (-1 if none)."""

    def source_words(self, source: Source) -> Words:
        """The columns grouped for word granularity; by default each column stands alone."""
        labels = tuple(token.piece for token in self.source_tokens(source))
        return Words(tuple(range(len(labels))), labels)

    def output_budget(self, source: Source) -> int | None:
        """The most output tokens this input can plausibly need (audio: by its duration); None = no bound."""
        return None

    def word_timings(self, source: Source, attention: np.ndarray, pieces: Sequence[str], words: Words,
                     confidences: Sequence[float] | None = None) -> list[WordTiming]:
        """Each output word's span of the input, for kinds that have time (audio); by default none.

        Args:
            attention: (R, S) the output pieces' attention over the source's S columns.
            confidences: one per word of `words`, carried into the timings.
        """
        return []

    def aligned_word_timings(self, source: Source, rows: np.ndarray, words: Words, special: Sequence[bool],
                             median_width: int, confidences: Sequence[float] | None = None) -> list[WordTiming]:
        """Word timestamps by DTW over alignment heads (manifest word_timestamps; audio only); by default none.

        Args:
            rows: (R, K, S) each timed token's attention as the decoder's input, in the K alignment heads.
        """
        return []

    def frame_attention(self, source: Source, attention: AttentionMatrix) -> list[FrameAttention]:
        """Each row's attention summed per frame and on its most-attended frame, for kinds with frames
        (video); by default none."""
        return []

    @abc.abstractmethod
    def describe(self, info: ModelInfo) -> ModelInfo:
        """`info` with this kind's fields filled in: input_kind, max_source_tokens, and its limits."""

    def _check_kind(self, request: GenerationRequest) -> None:
        """Raises ValueError unless the request carries exactly one input, of this preprocessor's kind."""
        kinds = request.input_kinds
        name, wanted = self.manifest.name, self.kind.value
        if len(kinds) > 1:
            raise ValueError(f"a request carries one input; this one has {' and '.join(k.value for k in kinds)}")
        if kinds and kinds[0] is not self.kind:
            raise ValueError(f"model '{name}' takes {wanted} input, not {kinds[0].value}")


@dataclasses.dataclass(frozen=True)
class TextSource:
    # Source ids, EOS included.
    ids: tuple[int, ...]

    @property
    def length(self) -> int:
        return len(self.ids)


class TextPreprocessor(Preprocessor):
    """Text: the tokenizer's ids plus EOS; columns are pieces, grouped into words by the tokenizer's rule."""

    kind = InputKind.TEXT

    def prepare(self, request: GenerationRequest) -> TextSource:
        self._check_kind(request)
        if not request.text or not request.text.strip():
            raise ValueError("text is empty; give the text to translate")
        name, limit = self.manifest.name, self.manifest.limits.max_source_tokens
        # Every piece covers at most max_piece_chars characters: refuse a surely-too-long text untokenized.
        chars = limit * self.tokenizer.source.max_piece_chars
        if len(request.text) > chars:
            raise ValueError(
                f"source is {len(request.text)} characters long; model '{name}' accepts at most {limit} tokens, "
                f"which is never more than {chars} characters"
            )
        ids = self.tokenizer.encode(request.text)
        if self.manifest.source_prefix:  # the target language's token first (manifest source_prefix)
            language = request.target_language or self.manifest.target_languages[0]
            ids = [self.manifest.source_prefix[language], *ids] if language in self.manifest.source_prefix else ids
        if self.manifest.source_language_prefix:  # the source language's token first (NLLB, M2M100)
            ids = [self.manifest.source_language_prefix[request.source_language or self.manifest.source_languages[0]], *ids]
        if len(ids) > limit:
            raise ValueError(f"source is {len(ids)} tokens long (EOS included); model '{name}' accepts at most {limit}")
        return TextSource(tuple(ids))

    def collate(self, sources: Sequence[TextSource]) -> EncoderBatch:
        inputs = self.manifest.encoder.inputs
        rows = [np.asarray(s.ids, dtype=np.int64) for s in sources]
        ids, mask = pad_batch(rows, self.manifest.special_tokens.pad)  # (B, S) each
        return EncoderBatch({inputs["input_ids"]: ids, inputs["attention_mask"]: mask}, mask.sum(axis=1))

    def source_tokens(self, source: TextSource) -> list[Token]:
        return [Token(p, i, 0.0) for p, i in zip(self.tokenizer.source.pieces(source.ids), source.ids)]

    def source_words(self, source: TextSource) -> Words:
        return self.tokenizer.source.words(source.ids)

    def describe(self, info: ModelInfo) -> ModelInfo:
        return dataclasses.replace(info, input_kind=self.kind, max_source_tokens=self.manifest.limits.max_source_tokens)
