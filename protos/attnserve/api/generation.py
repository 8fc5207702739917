"""Plain data passed between the gRPC edge and the serving core.

The servicer converts protobuf messages to these dataclasses exactly once, on the way in, and back once on
the way out. Core code (decoding, batching, attention) knows only these types.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only raw audio samples are arrays: the client distribution installs without numpy
    import numpy as np


@dataclasses.dataclass(frozen=True)
class SamplingOptions:
    """Draw each token at random from the model's (reshaped) distribution instead of taking the best."""

    # Divides the logits before sampling: < 1 sharpens the distribution, > 1 flattens it; must be > 0.
    temperature: float = 1.0
    # Sample among the k most likely tokens only; 0 = no limit.
    top_k: int = 0
    # Sample among the most likely tokens whose probabilities add up to at least p (nucleus); 1 = all.
    top_p: float = 1.0
    # Seed of the request's own random generator: the same seed gives the same output, alone or batched
    # with other requests. None = a fresh seed per request.
    seed: int | None = None


@dataclasses.dataclass(frozen=True)
class DecodingOptions:
    # Upper bound on generated tokens (EOS not counted); 0 means the model's `limits.max_new_tokens`.
    max_new_tokens: int = 0
    # 1 = greedy search; > 1 = beam search with that many beams; 0 = the model's default
    # (`ModelInfo.default_beam_size`; see `resolved_beam_size`).
    beam_size: int = 0
    # How many of the best sequences the result lists with their scores (`GenerationResult.nbest`);
    # 1 = only the output itself. At most beam_size.
    num_return_sequences: int = 1
    # End-of-sequence is not allowed before this many tokens were generated; 0 = no minimum.
    min_new_tokens: int = 0
    # No n-gram of this many tokens occurs twice in the output (a repetition guard); 0 = no guard.
    no_repeat_ngram_size: int = 0
    # Sample instead of searching (greedy only: beam_size 1); None = the deterministic search.
    sampling: SamplingOptions | None = None
    # > 0: rerank the beam's candidates by their score (log-probability / length) + reverse_weight x
    # log p(source | candidate), the same model translating each candidate back (server/engine/reranking.py).
    # Beam search on a model that translates both ways; not streamed. 0 = the beam's own order.
    reverse_weight: float = 0.0
    # Terminology constraints: (source term, required target term) pairs, sorted (server/decoding/glossary.py).
    # use_default_glossary: also the model's default glossary, these pairs winning where both name a term.
    glossary: tuple[tuple[str, str], ...] = ()
    use_default_glossary: bool = False
    # Audio: decode the recording once, at its own speed, even where the model reads it at several
    # (AudioInputInfo.speeds): less compute, the accuracy of one reading.
    read_once: bool = False
    # Words the output is expected to hold (names, terms): the search favours writing them, each letter of
    # one gaining hotword_boost (server/decoding/hotwords.py); a phrase's words count one by one; at most
    # 100 words. hotword_boost 0 = the default (DEFAULT_HOTWORD_BOOST).
    hotwords: tuple[str, ...] = ()
    hotword_boost: float = 0.0


# The boost per letter of a hotword when a request names none (chosen on speech-en 12's dev clips).
DEFAULT_HOTWORD_BOOST = 0.25

# Greedy search whatever the model's default search is: what a comparison with another greedy decoder needs.
GREEDY = DecodingOptions(beam_size=1)


class AttentionGranularity(enum.Enum):
    PIECES = "pieces"  # one row/column per subword piece
    WORDS = "words"  # pieces merged into words: columns summed, rows averaged


class AttentionReduction(enum.Enum):
    MEAN = "mean"  # the heads' mean: rows sum to 1
    MAX = "max"  # the heads' element-wise maximum: what any one head looked at


@dataclasses.dataclass(frozen=True)
class AttentionOptions:
    # False: no attention matrix in the result.
    enabled: bool = False
    # Decoder layer to read; negative counts from the last (-1 = last layer). None = the model's default
    # (its manifest's `attention.default_layer`: the layer whose attention aligns words best).
    layer: int | None = None
    # How subword pieces are grouped in the returned matrix.
    granularity: AttentionGranularity = AttentionGranularity.PIECES
    # Heads of the layer to combine (negative counts from the last); empty = all of them.
    heads: tuple[int, ...] = ()
    # How the heads are combined.
    reduction: AttentionReduction = AttentionReduction.MEAN


class InputKind(enum.Enum):
    """What a model reads (its manifest's `input.kind`); each kind has one preprocessor."""

    TEXT = "text"
    AUDIO = "audio"
    IMAGE = "image"
    VIDEO = "video"


@dataclasses.dataclass(frozen=True, eq=False)
class AudioInput:
    """Audio to transcribe or translate: a WAV file, or raw mono samples with their sample rate."""

    # A WAV file (16/32-bit integer PCM or 32/64-bit float, mono or stereo); b"" when `samples` is set.
    wav: bytes = b""
    # (N,) float32 mono samples, nominally in [-1, 1]; None when `wav` is set.
    samples: np.ndarray | None = None
    # Rate of `samples` in Hz (required with them); with `wav`, 0 or the rate its header states.
    sample_rate_hz: int = 0

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AudioInput):
            return NotImplemented
        if self.samples is None or other.samples is None:
            same_samples = self.samples is other.samples  # both None
        else:
            import numpy as np  # two arrays: numpy is loaded already (see the import above)

            same_samples = np.array_equal(self.samples, other.samples)
        return self.wav == other.wav and self.sample_rate_hz == other.sample_rate_hz and same_samples

    __hash__ = None


@dataclasses.dataclass(frozen=True)
class ImageInput:
    # An encoded image file (PNG or JPEG).
    data: bytes = b""


@dataclasses.dataclass(frozen=True)
class VideoInput:
    """A clip: a video file, or its frames as still images with their rate."""

    # An encoded video file (MP4/H.264, WebM/VP8/VP9 or an animated GIF); b"" when `frames` is set.
    data: bytes = b""
    # PNG or JPEG files, one per frame in time order; empty when `data` is set.
    frames: tuple[bytes, ...] = ()
    # Rate of `frames` (required with them): frame i shows time i / rate.
    frames_per_second: float = 0.0


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    # Name of the model in the repository.
    model: str
    # Source text (text models); "" when the request carries audio or an image.
    text: str = ""
    # Target language code, e.g. "en" or "zh-TW"; "" = the model's only target language, or for text the one
    # the text is not written in (protos/attnserve/api/language_detection.py), else the first.
    target_language: str = ""
    decoding: DecodingOptions = DecodingOptions()
    attention: AttentionOptions = AttentionOptions()
    # Caller-chosen id echoed in logs; "" = none.
    request_id: str = ""
    # Audio (speech models); None for other inputs.
    audio: AudioInput | None = None
    # An image (captioning models); None for other inputs.
    image: ImageInput | None = None
    # A clip (video captioning models); None for other inputs.
    video: VideoInput | None = None
    # Language of the text (TextInput.source_language); "" = the model's first source language. Read by models
    # whose source starts with a source-language token (manifest source_language_prefix: NLLB, M2M100).
    source_language: str = ""

    @property
    def input_kinds(self) -> list[InputKind]:
        """The kinds of input the request carries (a valid request carries exactly one)."""
        kinds = [InputKind.TEXT] if self.text else []
        kinds += [InputKind.AUDIO] if self.audio is not None else []
        kinds += [InputKind.IMAGE] if self.image is not None else []
        kinds += [InputKind.VIDEO] if self.video is not None else []
        return kinds


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
class AttentionExplanation:
    """Summaries read off an attention matrix (server/attention/explanation.py; docs/api.md, "Explanations")."""

    # Per row: the column it attended to most (a hard alignment of each output piece or word).
    alignment: list[int]
    # Per column: the attention it received, summed over rows (1.0 = one row's worth).
    coverage: list[float]
    # Per row: the entropy of its distribution over the columns, in nats (0 = all on one column).
    entropy: list[float]
    # Per column: True when it received almost no attention (coverage below `neglect_threshold`): a hint
    # that the output may have left that source word out. The source's end token is never flagged.
    neglected: list[bool]
    # The coverage below which a column is flagged.
    neglect_threshold: float


@dataclasses.dataclass(frozen=True)
class AttentionMatrix:
    # weights[r][c]: attention of output row r on source column c.
    weights: list[list[float]]
    row_labels: list[str]  # output pieces or words
    col_labels: list[str]  # source pieces or words
    layer: int  # the decoder layer read (non-negative)
    reduction: str  # what was reduced, e.g. "layer 2 of 3, mean over 4 heads, words"
    # Alignment, coverage, entropy and omission hints computed from `weights`; None when not computed.
    explanation: AttentionExplanation | None = None


@dataclasses.dataclass(frozen=True)
class WordTiming:
    """A word of an audio transcript and the time span the model attended to while writing it."""

    word: str
    start_seconds: float
    end_seconds: float
    # How sure the search was of the word, in (0, 1]: exp(scale x the mean log-score of its pieces and of
    # the word boundary after it), the scale set per model so that it reads as the chance the word is right
    # (server/decoding/word_confidence.py). None when the server did not say.
    confidence: float | None = None


class FinishReason(enum.Enum):
    EOS = "eos"  # the model produced end-of-sequence
    LENGTH = "length"  # max_new_tokens reached


@dataclasses.dataclass(frozen=True)
class TranscriptSegment:
    """One stretch of a recording longer than the model's window, cut at pauses and transcribed alone
    (server/engine/longform.py). A stream yields each as soon as it is transcribed; the result lists them all."""

    index: int  # position among the recording's segments, in time order, counted from 0
    count: int  # how many segments the recording was cut into
    start_seconds: float  # where the segment starts, from the start of the recording
    end_seconds: float  # where it ends
    text: str  # its transcript
    words: list[WordTiming]  # its words, timed from the start of the recording (not of the segment)
    finish_reason: FinishReason  # why its decoding stopped


@dataclasses.dataclass(frozen=True)
class Timings:
    queue_seconds: float  # accepted -> first model call for this request
    encode_seconds: float  # encoder call of the batch it ran in
    first_token_seconds: float  # accepted -> first output token
    decode_seconds: float  # first decode step -> finished
    total_seconds: float  # accepted -> result ready
    batch_size: int  # most requests that shared a decoder call with it (itself included)


@dataclasses.dataclass(frozen=True)
class ScoredSequence:
    """One of the n best outputs of a request, with the score the search ranked it by."""

    text: str
    tokens: list[Token]  # EOS excluded
    # Summed log-probability divided by the length in tokens (EOS included when it ended the sequence).
    score: float
    finish_reason: FinishReason


@dataclasses.dataclass(frozen=True)
class GlossaryPlacement:
    """A glossary term found in the source and the output tokens that spell its target term."""

    source: str
    target: str
    source_start: int  # characters of the text: [source_start, source_end)
    source_end: int
    output_start: int  # output tokens: [output_start, output_end); -1, -1 = not in the output
    output_end: int


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
    # Audio input: each word's time span, read from the attention (server/attention/timestamps.py); else empty.
    words: list[WordTiming] = dataclasses.field(default_factory=list)
    # DecodingOptions.num_return_sequences > 1: the best sequences, best first (the first is the output
    # above); at most that many, fewer when the model can produce fewer. Else empty.
    nbest: list[ScoredSequence] = dataclasses.field(default_factory=list)
    # Audio longer than the model's window (long-form): its segments in time order; else empty.
    segments: list[TranscriptSegment] = dataclasses.field(default_factory=list)
    # Glossary terms of the source, in order, and where the output placed each; empty without any.
    glossary: list[GlossaryPlacement] = dataclasses.field(default_factory=list)
    # Video input with attention: each output row's attention per frame and over its most-attended frame.
    frames: list[FrameAttention] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class FrameAttention:
    """One output row's attention over a clip, summed per frame (timeline) and on its peak frame (heatmap)."""

    word: str  # the row's label in the attention matrix (a word or a piece)
    timeline: list[float]  # per sampled frame, in time order: the row's weights summed over the frame's cells
    frame_seconds: list[float]  # the time each sampled frame shows, in seconds
    peak_frame: int  # the frame with the largest sum (an index into timeline)
    heatmap: list[float]  # the row's weights over peak_frame's cells, row by row (grid_rows x grid_cols)


@dataclasses.dataclass(frozen=True)
class AudioInputInfo:
    """What an audio model accepts."""

    sample_rate_hz: int  # the rate its features are computed at; other rates are resampled to it
    max_seconds: float  # longest accepted audio
    max_bytes: int  # largest accepted WAV file (raw samples count 4 bytes each)
    seconds_per_column: float  # time one attention column spans (frame shift x the encoder's time reduction)
    # Long-form: audio longer than max_seconds, up to this long, is cut at pauses and transcribed segment by
    # segment (server/engine/longform.py); 0 = not accepted (an older server, or a model it does not cut).
    long_form_max_seconds: float = 0.0
    # The largest long-form AudioInput data, in bytes (one hour of 16 kHz 16-bit mono WAV fits).
    long_form_max_bytes: int = 0
    # Audio file formats AudioInput data may be in, e.g. ("wav", "flac", "ogg", "mp3"); () = WAV only.
    formats: tuple[str, ...] = ()
    # Playback speeds a beam-searched recording is decoded at, the best-scoring reading answering
    # (server/engine/speed_readings.py); (1.0,) or () (an older server) = once.
    speeds: tuple[float, ...] = ()
    # Whether beam-searched candidates are rescored with the model's word LM (server/decoding/word_lm.py).
    word_lm: bool = False


@dataclasses.dataclass(frozen=True)
class ImageInputInfo:
    """What an image model accepts."""

    width: int  # pixels of the model's input
    height: int
    grid_rows: int  # the encoder's grid of cells: one attention column per cell
    grid_cols: int
    max_bytes: int  # largest accepted image file
    max_pixels: int  # most pixels an image header may declare (decompression bombs are refused)


@dataclasses.dataclass(frozen=True)
class VideoInputInfo:
    """What a video model accepts."""

    frames: int  # frames sampled from every clip (the middle of equal stretches of it)
    width: int  # pixels of each frame of the model's input
    height: int
    grid_rows: int  # the encoder's grid per frame: one attention column per (frame, cell)
    grid_cols: int
    max_seconds: float  # longest accepted clip
    max_bytes: int  # largest accepted file (or all stills together)
    max_pixels: int  # most pixels a frame may declare (refused before decoding)
    max_frames: int  # most frames a file may hold (or stills a request may list)


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    name: str
    version: int
    task: str  # e.g. "translation", "speech-recognition", "image-captioning"
    description: str
    source_languages: list[str]
    target_languages: list[str]
    # Text: longest source in tokens (EOS included). Audio, images: most attention columns a source has.
    max_source_tokens: int
    max_new_tokens: int
    attention_layers: int
    attention_heads: int
    input_kind: InputKind = InputKind.TEXT
    audio: AudioInputInfo | None = None  # set for audio models
    image: ImageInputInfo | None = None  # set for image models
    video: VideoInputInfo | None = None  # set for video models
    max_text_chars: int = 0  # text models: the longest accepted text in characters; 0 for other kinds
    max_beam_size: int = 0  # the largest DecodingOptions.beam_size
    # Beams a request gets with beam_size 0 (unset); 1 = greedy. 0 from a server too old to say: 1.
    default_beam_size: int = 1
    max_request_bytes: int = 0  # the largest GenerateRequest accepted; bigger ones are refused unparsed
    max_attention_values: int = 0  # most attention weights in one response; 0 = only the model's own bounds
    max_response_bytes: int = 0  # the largest response message the server sends
    variant: str = ""  # the manifest variant whose graphs are served ("" = the default graphs)
    glossary_terms: int = 0  # entries of the model's default glossary


def resolved_beam_size(options: DecodingOptions, default: int) -> int:
    """The beams a request decodes with: its own beam_size, or when it names none (0), 1 if it samples, else
    the model's default, raised to its num_return_sequences."""
    if options.beam_size:
        return options.beam_size
    if options.sampling is not None:
        return 1
    return max(default, options.num_return_sequences, 1)


# Errors raised by core code. The gRPC edge maps each type to one status code (see server/edge/errors.py):
# InputTooLargeError -> OUT_OF_RANGE, ValueError -> INVALID_ARGUMENT, NotImplementedError -> UNIMPLEMENTED,
# OverloadedError -> RESOURCE_EXHAUSTED, UnavailableError -> UNAVAILABLE, TimeoutError -> DEADLINE_EXCEEDED,
# else INTERNAL.


class InputTooLargeError(ValueError):
    """The input exceeds a limit the model states in its ModelInfo (audio duration, bytes)."""


class OverloadedError(Exception):
    """The server shed the request for load (a full queue, a budget, a deadline it cannot meet); the client
    may retry later.

    Args:
        reason: the limit, as the metrics label it (attnserve_rejected_requests_total's `reason`).
        retry_after: seconds after which a retry may fit, when the server can tell; None = unknown.
    """

    def __init__(self, message: str, reason: str = "queue_full", retry_after: float | None = None):
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after

    def __reduce__(self):  # keeps reason and retry_after across --engine-process's pipe
        return type(self), (str(self), self.reason, self.retry_after)


class ModelNotFoundError(Exception):
    """The request names a model the server does not have (NOT_FOUND)."""


class ModelNotServedError(Exception):
    """The request names a model the server has but could not load (FAILED_PRECONDITION: retrying the same
    server will not help; its log says why)."""


class UnavailableError(Exception):
    """The model is shutting down or failed to load."""
