"""Plain data passed between the gRPC edge and the serving core.

The servicer converts protobuf messages to these dataclasses exactly once, on the way in, and back once on
the way out. Core code (decoding, batching, attention) knows only these types.
"""

from __future__ import annotations

import dataclasses
import enum


@dataclasses.dataclass(frozen=True)
class DecodingOptions:
    # Upper bound on generated tokens (EOS not counted); 0 means the model's `limits.max_new_tokens`.
    max_new_tokens: int = 0
    # 1 = greedy search; > 1 = beam search with that many beams.
    beam_size: int = 1


class AttentionGranularity(enum.Enum):
    PIECES = "pieces"  # one row/column per subword piece
    WORDS = "words"  # pieces merged into words: columns summed, rows averaged


@dataclasses.dataclass(frozen=True)
class AttentionOptions:
    # False: no attention matrix in the result.
    enabled: bool = False
    # Decoder layer to read; negative counts from the last (-1 = last layer). None = the model's default
    # (its manifest's `attention.default_layer`: the layer whose attention aligns words best).
    layer: int | None = None
    # How subword pieces are grouped in the returned matrix.
    granularity: AttentionGranularity = AttentionGranularity.PIECES


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    # Name of the model in the repository.
    model: str
    # Source text (text models). Audio and image inputs come with their models.
    text: str
    # Target language code, e.g. "en" or "zh-TW"; "" = the model's only / first target language.
    target_language: str = ""
    decoding: DecodingOptions = DecodingOptions()
    attention: AttentionOptions = AttentionOptions()
    # Caller-chosen id echoed in logs; "" = none.
    request_id: str = ""


@dataclasses.dataclass(frozen=True)
class Token:
    piece: str  # the tokenizer's piece, e.g. "▁power"
    id: int
    logprob: float  # log-probability under the model (0.0 for source tokens)


@dataclasses.dataclass(frozen=True)
class StreamedToken:
    """One output token as soon as it is known, before the final result."""

    index: int  # position in the output, counted from 0
    token: Token
    # The token's row of the piece-level attention matrix: the chosen layer, mean over heads, one weight
    # per source piece (EOS included), whatever granularity the final matrix has. None without attention.
    attention: list[float] | None = None
    # The text this token adds to the output: detokenized, "" for special tokens. The concatenated texts
    # of a stream equal the final result's text.
    text: str = ""


@dataclasses.dataclass(frozen=True)
class AttentionMatrix:
    # weights[r][c]: attention of output row r on source column c.
    weights: list[list[float]]
    row_labels: list[str]  # output pieces or words
    col_labels: list[str]  # source pieces or words
    layer: int  # the decoder layer read (non-negative)
    reduction: str  # what was reduced, e.g. "layer 2 of 3, mean over 4 heads, words"


class FinishReason(enum.Enum):
    EOS = "eos"  # the model produced end-of-sequence
    LENGTH = "length"  # max_new_tokens reached


@dataclasses.dataclass(frozen=True)
class Timings:
    queue_seconds: float  # accepted -> first model call for this request
    encode_seconds: float  # encoder call of the batch it ran in
    first_token_seconds: float  # accepted -> first output token
    decode_seconds: float  # first decode step -> finished
    total_seconds: float  # accepted -> result ready
    batch_size: int  # requests that shared its encoder call


@dataclasses.dataclass(frozen=True)
class GenerationResult:
    model: str
    text: str
    target_language: str
    tokens: list[Token]  # generated tokens, EOS excluded
    source_tokens: list[Token]  # source pieces, EOS included
    finish_reason: FinishReason
    attention: AttentionMatrix | None
    timings: Timings


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    name: str
    version: int
    task: str  # "translation", later "speech-captioning", "image-captioning"
    description: str
    source_languages: list[str]
    target_languages: list[str]
    max_source_tokens: int
    max_new_tokens: int
    attention_layers: int
    attention_heads: int


# Errors raised by core code. The gRPC edge maps each type to one status code (see server/errors.py):
# ValueError -> INVALID_ARGUMENT, NotImplementedError -> UNIMPLEMENTED, OverloadedError ->
# RESOURCE_EXHAUSTED, UnavailableError -> UNAVAILABLE, TimeoutError -> DEADLINE_EXCEEDED, else INTERNAL.


class OverloadedError(Exception):
    """The model's queue is full; the client may retry later."""


class UnavailableError(Exception):
    """The model is shutting down or failed to load."""
