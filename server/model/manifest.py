"""Parses and validates manifest.json (docs/model-contract.md) into frozen dataclasses.

The decode loop is driven only by these objects: which tensors the encoder feeds to the decoder once per
request (`static`), which decoder state is carried from step to step (`state`), and the model's limits.
What the encoder reads is described by the model's `input` (server/inputs/inputs.py): its kind (text, audio,
image) and the preprocessing that turns a request's raw input into encoder feeds (server/inputs/preprocessing.py
and one module per kind). A manifest without `input` is a text model. Every problem is reported as a `ValueError` that
names the file and the field.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import types
from collections.abc import Mapping
from typing import Any, NoReturn

from attnserve.server.inputs.inputs import InputSpec, TextInputSpec, parse_input

FORMAT_VERSION = 1
WORD_BOUNDARIES = ("metaspace-cjk", "byte-level")
STATE_UPDATES = ("append", "replace")
STATE_DTYPES = ("float32", "float16", "int64", "int32", "bool")


@dataclasses.dataclass(frozen=True)
class SourceTokenizerSpec:
    """A tokenizer of its own for reading text sources, when the model reads and writes differently (an
    imported Marian model: source SentencePiece model and vocabulary; docs/model-contract.md)."""

    # Tokenizer file name inside the version folder.
    file: str
    # The encoder's vocabulary, a JSON object piece -> id (0..N-1): the tokenizer's ids from N on (pieces the
    # vocabulary lacks) are read as `unk`, and a run of characters it could not segment is looked up here.
    vocab: str


@dataclasses.dataclass(frozen=True)
class TokenizerSpec:
    # Tokenizer file name inside the version folder (the output's; text sources too unless `source` is set).
    file: str
    # How pieces group into words for word-level attention (see WORD_BOUNDARIES).
    word_boundary: str
    # The source text's own tokenizer; None = `file` reads the source too.
    source: SourceTokenizerSpec | None = None


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
    pad: int
    unk: int
    eos: int
    # Ids the decoder must never emit (padding, decoder-start / language tokens); optional in the manifest.
    suppress: tuple[int, ...] = ()
    # Ids the first step after the decoder prompt must not emit (Whisper's begin_suppress_tokens: a blank
    # or an empty transcript); optional.
    begin_suppress: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class WordTimestampsSpec:
    """Word times read from chosen heads' cross-attention by dynamic time warping (Whisper's alignment
    heads; server/attention/alignment.py) instead of the default layer's monotonic path."""

    # (layer, head) pairs whose attention is averaged.
    alignment_heads: tuple[tuple[int, int], ...]
    # Width of the median filter run along the frames of each head's normalised attention (odd).
    median_filter_width: int = 7


@dataclasses.dataclass(frozen=True)
class Limits:
    # Longest source, in tokens, EOS included (text input); None for other kinds, whose `input` has limits.
    max_source_tokens: int | None
    # Upper bound (and default) for generated tokens, EOS not counted.
    max_new_tokens: int
    # Most requests one encoder call reads (their rows still join one decode batch); None = the server's
    # --max-batch-size. Whisper's encoder attends over 1,500 x 1,500 positions per head: past a few clips
    # a batch only costs memory bandwidth (bench/import_whisper_ctranslate2.py).
    max_encoder_batch: int | None = None


@dataclasses.dataclass(frozen=True)
class DecodingDefaults:
    """The search a request gets when it names none (manifest `decoding`, optional)."""

    # Beams of a request whose beam_size is 0 (unset) and that does not sample; 1 = greedy search.
    beam_size: int = 1
    # Beam search stops a request as soon as it has beam_size finished sequences (transformers'
    # early_stopping=True); False = only once no running beam can beat them (early_stopping=False).
    early_stopping: bool = False
    # Audio: the playback speeds a beam-searched recording is decoded at, 1.0 among them; the reading whose
    # best sequence scores highest answers (server/engine/speed_readings.py). (1.0,) = the recording alone.
    speeds: tuple[float, ...] = (1.0,)
    # Word confidences are exp(this x the mean log-score of a word's pieces), fitted so that they read as the
    # chance the word is right (server/decoding/word_confidence.py); 1.0 = the geometric mean probability.
    word_confidence_scale: float = 1.0


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    # Decoder output holding the step's attention, shape (B, layers, heads, S).
    output: str
    layers: int
    heads: int
    # Layer returned when a request names none; negative counts from the last.
    default_layer: int = -1


@dataclasses.dataclass(frozen=True)
class LengthHint:
    """An encoder output estimating each row's output length (e.g. a CTC head's best-path length): a row
    stops after ceil(scale x hint) + offset new tokens, so a decoder caught in a loop stops near it."""

    output: str  # encoder output, (B,) int64
    scale: float = 1.0
    offset: int = 0


@dataclasses.dataclass(frozen=True)
class CTCScoring:
    """Encoder outputs of a CTC head, for joint CTC/attention decoding (server/decoding/ctc_prefix.py): every
    candidate token is ranked by (1 - weight) x its decoder log-probability + weight x its CTC prefix score."""

    log_probs: str  # encoder output (B, T', V) float32: CTC log-probabilities over the decoder's vocabulary
    lengths: str  # encoder output (B,) int64: real CTC frames per row
    blank_id: int = 0
    weight: float = 0.3


@dataclasses.dataclass(frozen=True)
class LanguageModelSpec:
    """A token n-gram LM for shallow fusion (server/decoding/ngram_lm.py): every candidate's score gains weight x its
    LM log-probability after the row's previous tokens."""

    file: str  # in the version folder, written by export/common/ngram_build.py
    weight: float = 0.3


@dataclasses.dataclass(frozen=True)
class WordLanguageModelSpec:
    """A word n-gram LM that chooses among an audio model's finished candidates (server/decoding/word_lm.py,
    server/engine/speed_readings.py): each candidate of every reading is ranked by its summed log-probability +
    weight x its LM log-probability + word_bonus x its words - unknown_penalty x its words outside the LM."""

    file: str  # in the version folder, written by export/common/word_ngram_build.py
    weight: float = 0.4
    word_bonus: float = 0.5
    unknown_penalty: float = 0.0


@dataclasses.dataclass(frozen=True)
class EncoderSpec:
    file: str
    # Role of each encoder input (as the model's input kind names them, e.g. "input_ids") -> graph input name.
    inputs: Mapping[str, str]
    # Optional output-length estimate that bounds each row's new tokens (docs/model-contract.md).
    length_hint: LengthHint | None = None
    # Optional CTC head that scores every step's candidates beside the decoder (docs/model-contract.md).
    ctc: CTCScoring | None = None


@dataclasses.dataclass(frozen=True)
class DecoderSpec:
    file: str
    # Graph input name for the newest token per row (B, 1).
    input_ids: str
    # Graph input name for per-row positions (B, 1); None if the model takes none.
    position_ids: str | None
    # Graph input name for the (B, T+1) self-attention mask; None if the model takes none.
    self_attention_mask: str | None
    # Graph output name of the next-token logits (B, V).
    logits: str


@dataclasses.dataclass(frozen=True)
class StaticFeed:
    """A decoder input computed once per request from the encoder call."""

    # Encoder input or output the tensor comes from.
    source: str
    # Decoder input it feeds.
    target: str
    batch_axis: int
    # Axis padded (with 0) when requests of different source lengths share a batch.
    source_axis: int


@dataclasses.dataclass(frozen=True)
class StateSpec:
    """Recurrent decoder state carried from one step to the next."""

    # Decoder input that receives the state, and decoder output that produces its update.
    input: str
    output: str
    # "append": concatenate the output along time_axis (K/V cache); "replace": feed the output back.
    update: str
    batch_axis: int
    # Axis the appended state grows along; None for "replace".
    time_axis: int | None
    dtype: str
    # Initial shape; "batch" stands for the batch size, "source" for the batch's attention columns.
    shape: tuple[int | str, ...]
    # None: zeros of `shape`; otherwise the name of the encoder output that initialises the state.
    init_from: str | None

    @property
    def source_axis(self) -> int | None:
        """The axis that runs along the source (e.g. a location-aware speller's previous attention)."""
        return self.shape.index("source") if "source" in self.shape else None


@dataclasses.dataclass(frozen=True)
class Variant:
    """Other graphs of the same model, e.g. int8-quantized ones, served when `attnserve serve --variant` asks."""

    encoder_file: str
    decoder_file: str


@dataclasses.dataclass(frozen=True)
class SpeechTranslationSpec:
    """Whisper's translate task: speech in any of the source languages written in `target`."""

    # The one language translations are written in ("en").
    target: str
    # Source language -> the decoder prompt that translates from it.
    prompt: Mapping[str, tuple[int, ...]]


@dataclasses.dataclass(frozen=True)
class Manifest:
    format_version: int
    name: str
    version: int
    task: str
    description: str
    source_languages: tuple[str, ...]
    target_languages: tuple[str, ...]
    tokenizer: TokenizerSpec
    special_tokens: SpecialTokens
    # Target language -> the token the decoder starts with.
    decoder_start: Mapping[str, int]
    limits: Limits
    attention: AttentionSpec
    encoder: EncoderSpec
    decoder: DecoderSpec
    static: tuple[StaticFeed, ...]
    state: tuple[StateSpec, ...]
    # What the encoder reads; a manifest without `input` is a text model.
    input: InputSpec = TextInputSpec()
    # Variant name (e.g. "int8") -> its graphs; same inputs, outputs and tokenizer as the default ones.
    variants: Mapping[str, Variant] = dataclasses.field(default_factory=dict)
    # Optional LM whose scores join the decoder's at every step (docs/model-contract.md).
    language_model: LanguageModelSpec | None = None
    # Optional word LM that chooses among an audio model's beam-searched candidates.
    word_language_model: WordLanguageModelSpec | None = None
    decoding: DecodingDefaults = DecodingDefaults()
    # Target language -> a token put before the text of the source (a multilingual Marian model reads the
    # language it should write, `>>cmn_Hant<<`, at the start of its input); empty for other models.
    source_prefix: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # Source language -> a token put before the text of the source (NLLB's `eng_Latn`, M2M100's `__en__`).
    source_language_prefix: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # Target language -> the decoder's forced first output token (NLLB, M2M100: forced_bos_token_id, the
    # target-language token after the start token); empty when the model chooses its first token itself.
    forced_first_token: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # Target language -> tokens fed after the start token before the model generates (Whisper's
    # <|en|> <|transcribe|> <|notimestamps|>): forced outputs that, as a prompt, count in no length
    # normalisation; empty for other models.
    decoder_prompt: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    # A request naming no target language gets the language whose decoder_prompt's first token the first
    # step scores highest (Whisper's language detection); False: the first target language.
    detect_language: bool = False
    word_timestamps: WordTimestampsSpec | None = None
    # Speech translation (Whisper's task=translate): a request whose source language differs from this
    # target language gets the source's prompt (`<|de|> <|translate|> <|notimestamps|>`) instead of the
    # target's; None: the output is always in the language written (transcription).
    speech_translation: SpeechTranslationSpec | None = None


class FieldReader:
    """Typed access to one JSON object with error messages that name the file and the field path.

    Shared with server/inputs/inputs.py, which parses the manifest's `input` section with it.
    """

    def __init__(self, data: Any, where: str, path: str = ""):
        self.where = where
        self.path = path
        if not isinstance(data, dict):
            self.fail(f"must be an object, got {type(data).__name__}")
        self.data = data

    def fail(self, problem: str) -> NoReturn:
        field = f" field '{self.path}'" if self.path else ""
        raise ValueError(f"{self.where}:{field} {problem}")

    def fail_field(self, key: str, problem: str) -> NoReturn:
        raise ValueError(f"{self.where}: field '{self._field(key)}' {problem}")

    def _field(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        if key not in self.data:
            if default is ...:
                raise ValueError(f"{self.where}: missing field '{self._field(key)}'")
            return default
        value = self.data[key]
        # bool is an int subclass; a JSON true is never a valid count or id.
        if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, (int,))):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise ValueError(f"{self.where}: field '{self._field(key)}' must be {names}, got {value!r}")
        return value

    def integer(self, key: str, minimum: int | None = None, default: Any = ...) -> int:
        value = self.get(key, int, default)
        if minimum is not None and value is not None and value < minimum:
            raise ValueError(f"{self.where}: field '{self._field(key)}' must be >= {minimum}, got {value}")
        return value

    def string(self, key: str, default: Any = ...) -> str:
        return self.get(key, str, default)

    def number(self, key: str, positive: bool = False, default: Any = ...) -> float:
        value = self.get(key, (int, float), default)
        if isinstance(value, bool):
            self.fail_field(key, f"must be a number, got {value!r}")
        if value is not None and not (value > 0 if positive else value >= 0):
            self.fail_field(key, f"must be {'>' if positive else '>='} 0, got {value}")
        return value if value is None else float(value)

    def numbers(self, key: str, count: int, positive: bool = False) -> tuple[float, ...]:
        values = self.get(key, list)
        ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        if not ok or len(values) != count or (positive and not all(v > 0 for v in values)):
            sign = "positive " if positive else ""
            self.fail_field(key, f"must be a list of {count} {sign}numbers, got {values!r}")
        return tuple(float(v) for v in values)

    def obj(self, key: str) -> FieldReader:
        return FieldReader(self.get(key, dict), self.where, self._field(key))

    def items(self, key: str) -> list[FieldReader]:
        return [FieldReader(x, self.where, f"{self._field(key)}[{i}]") for i, x in enumerate(self.get(key, list))]

    def strings(self, key: str) -> tuple[str, ...]:
        values = self.get(key, list)
        if not values or not all(isinstance(v, str) and v for v in values):
            raise ValueError(f"{self.where}: field '{self._field(key)}' must be a non-empty list of strings")
        return tuple(values)


def load_manifest(path: str | pathlib.Path) -> Manifest:
    """Reads and validates a manifest.json file.

    Raises:
        ValueError: the file is missing, is not JSON, or breaks the contract; the message names the file.
    """
    path = pathlib.Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read manifest: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from exc
    return parse_manifest(data, where=str(path))


def parse_manifest(data: Any, where: str = "manifest.json") -> Manifest:
    """Validates a decoded manifest. Unknown fields (e.g. `model_config`) are ignored.

    Args:
        data: the decoded JSON object.
        where: file name used in error messages.

    Raises:
        ValueError: a field is missing, mistyped or inconsistent; the message names the file and field.
    """
    r = FieldReader(data, where)
    format_version = r.integer("format_version")
    if format_version != FORMAT_VERSION:
        r.fail(f"format_version {format_version} is not supported (this server reads {FORMAT_VERSION})")
    languages = r.obj("languages")
    attention = r.obj("attention")
    input_spec = parse_input(r)
    manifest = Manifest(
        format_version=format_version,
        name=r.string("name"),
        version=r.integer("version", minimum=0),
        task=r.string("task"),
        description=r.string("description", default=""),
        source_languages=languages.strings("source"),
        target_languages=languages.strings("target"),
        tokenizer=_tokenizer(r.obj("tokenizer")),
        special_tokens=_special_tokens(r.obj("special_tokens")),
        decoder_start=_decoder_start(r.obj("decoder_start")),
        limits=_limits(r.obj("limits"), input_spec),
        attention=_attention(attention),
        encoder=_encoder(r.obj("encoder"), input_spec),
        decoder=_decoder(r.obj("decoder")),
        static=tuple(_static(s) for s in r.items("static")),
        state=tuple(_state(s) for s in r.items("state")),
        input=input_spec,
        variants=_variants(r),
        language_model=_language_model(r),
        word_language_model=_word_language_model(r, input_spec),
        decoding=_decoding_defaults(r, input_spec),
        source_prefix=_optional_tokens(r, "source_prefix"),
        source_language_prefix=_optional_tokens(r, "source_language_prefix"),
        forced_first_token=_optional_tokens(r, "forced_first_token"),
        decoder_prompt=_decoder_prompt(r),
        detect_language=r.get("detect_language", bool, False),
        word_timestamps=_word_timestamps(r, attention),
        speech_translation=_speech_translation(r),
    )
    _check_consistency(manifest, where)
    return manifest


def _variants(r: FieldReader) -> Mapping[str, Variant]:
    if "variants" not in r.data:
        return types.MappingProxyType({})
    variants = r.obj("variants")
    return types.MappingProxyType({
        name: Variant(v.string("encoder"), v.string("decoder")) for name in variants.data for v in [variants.obj(name)]
    })


def _language_model(r: FieldReader) -> LanguageModelSpec | None:
    if "language_model" not in r.data:
        return None
    lm = r.obj("language_model")
    weight = lm.number("weight", default=LanguageModelSpec.weight)
    if weight > 1:
        lm.fail_field("weight", f"must be in [0, 1], got {weight}")
    return LanguageModelSpec(lm.string("file"), weight)


def _word_language_model(r: FieldReader, spec: InputSpec) -> WordLanguageModelSpec | None:
    if "word_language_model" not in r.data:
        return None
    lm = r.obj("word_language_model")
    _require_audio(r, "word_language_model", spec)
    weight = lm.number("weight", default=WordLanguageModelSpec.weight)
    if not 0 <= weight <= 10:
        lm.fail_field("weight", f"must be in [0, 10], got {weight}")
    return WordLanguageModelSpec(lm.string("file"), weight,
                                 lm.number("word_bonus", default=WordLanguageModelSpec.word_bonus),
                                 lm.number("unknown_penalty", default=WordLanguageModelSpec.unknown_penalty))


def _decoding_defaults(r: FieldReader, spec: InputSpec) -> DecodingDefaults:
    if "decoding" not in r.data:
        return DecodingDefaults()
    d = r.obj("decoding")
    return DecodingDefaults(beam_size=d.integer("beam_size", 1, DecodingDefaults.beam_size),
                            early_stopping=d.get("early_stopping", bool, DecodingDefaults.early_stopping),
                            speeds=_speeds(d, spec),
                            word_confidence_scale=d.number("word_confidence_scale", positive=True,
                                                           default=DecodingDefaults.word_confidence_scale))


def _require_audio(r: FieldReader, field: str, spec: InputSpec) -> None:
    if spec.kind != "audio":
        r.fail_field(field, f"applies to audio input, not {spec.kind}")


def _speeds(d: FieldReader, spec: InputSpec) -> tuple[float, ...]:
    if "speeds" not in d.data:
        return DecodingDefaults.speeds
    _require_audio(d, "speeds", spec)
    values = d.get("speeds", list)
    rate = spec.features.sample_rate_hz
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0.5 <= v <= 2.0 for v in values)
    if not ok or 1.0 not in values or len(set(values)) != len(values):
        d.fail_field("speeds", f"must be distinct numbers in [0.5, 2], 1.0 among them, got {values!r}")
    # A reading is the recording's samples relabelled at rate x speed: that rate must be a whole number.
    odd = [v for v in values if abs(rate * v - round(rate * v)) > 1e-6]
    if odd:
        d.fail_field("speeds", f"must give whole sample rates at {rate} Hz ({rate} x speed); {odd} do not")
    return tuple(float(v) for v in values)


def _limits(r: FieldReader, spec: InputSpec) -> Limits:
    encoder_batch = r.integer("max_encoder_batch", 1, default=None)
    if spec.kind == "text":
        return Limits(r.integer("max_source_tokens", 1), r.integer("max_new_tokens", 1), encoder_batch)
    if "max_source_tokens" in r.data:
        r.fail(f"max_source_tokens applies to text input; the limits of {spec.kind} input are in 'input'")
    return Limits(None, r.integer("max_new_tokens", 1), encoder_batch)


def _tokenizer(r: FieldReader) -> TokenizerSpec:
    source = None
    if "source" in r.data:
        s = r.obj("source")
        source = SourceTokenizerSpec(s.string("file"), s.string("vocab"))
    spec = TokenizerSpec(file=r.string("file"), word_boundary=r.string("word_boundary"), source=source)
    if spec.word_boundary not in WORD_BOUNDARIES:
        r.fail(f"word_boundary {spec.word_boundary!r} is not one of {list(WORD_BOUNDARIES)}")
    return spec


def _attention(r: FieldReader) -> AttentionSpec:
    spec = AttentionSpec(
        r.string("output"), r.integer("layers", 1), r.integer("heads", 1), r.integer("default_layer", None, -1)
    )
    if not -spec.layers <= spec.default_layer < spec.layers:
        raise ValueError(f"{r.where}: field 'attention.default_layer' {spec.default_layer} is not a layer of {spec.layers}")
    return spec


def _special_tokens(r: FieldReader) -> SpecialTokens:
    suppress = r.get("suppress", list, [])
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in suppress):
        raise ValueError(f"{r.where}: field 'special_tokens.suppress' must be a list of token ids, got {suppress!r}")
    begin = r.get("begin_suppress", list, [])
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in begin):
        raise ValueError(f"{r.where}: field 'special_tokens.begin_suppress' must be a list of token ids, got {begin!r}")
    tokens = SpecialTokens(*(r.integer(k, 0) for k in ("pad", "unk", "eos")), suppress=tuple(suppress),
                           begin_suppress=tuple(begin))
    if tokens.eos in tokens.suppress:
        raise ValueError(f"{r.where}: field 'special_tokens.suppress' holds the eos id {tokens.eos}")
    return tokens


def _decoder_start(r: FieldReader) -> Mapping[str, int]:
    return types.MappingProxyType({language: r.integer(language, 0) for language in r.data})


def _encoder(r: FieldReader, spec: InputSpec) -> EncoderSpec:
    inputs = r.obj("inputs")
    roles = sorted(spec.encoder_inputs())
    if sorted(inputs.data) != roles:
        got = sorted(inputs.data)
        inputs.fail(f"must name the encoder input of each role of {spec.kind} input, {roles}; got {got}")
    hint = None
    if "length_hint" in r.data:
        h = r.obj("length_hint")
        hint = LengthHint(h.string("output"), h.number("scale", positive=True, default=1.0),
                          h.integer("offset", 0, default=0))
    ctc = None
    if "ctc" in r.data:
        c = r.obj("ctc")
        weight = c.number("weight", default=CTCScoring.weight)
        if weight > 1:
            c.fail_field("weight", f"must be in [0, 1], got {weight}")
        ctc = CTCScoring(c.string("log_probs"), c.string("lengths"), c.integer("blank_id", 0, default=0), weight)
    return EncoderSpec(file=r.string("file"), inputs=types.MappingProxyType({k: inputs.string(k) for k in roles}),
                       length_hint=hint, ctc=ctc)


def _decoder(r: FieldReader) -> DecoderSpec:
    inputs = r.obj("inputs")
    return DecoderSpec(
        file=r.string("file"),
        input_ids=inputs.string("input_ids"),
        position_ids=inputs.string("position_ids", default=None),
        self_attention_mask=inputs.string("self_attention_mask", default=None),
        logits=r.obj("outputs").string("logits"),
    )


def _static(r: FieldReader) -> StaticFeed:
    if r.data.get("batch_axis") == r.data.get("source_axis"):
        r.fail("batch_axis and source_axis must differ")
    return StaticFeed(
        source=r.string("from"),
        target=r.string("to"),
        batch_axis=r.integer("batch_axis", 0),
        source_axis=r.integer("source_axis", 0),
    )


def _state(r: FieldReader) -> StateSpec:
    update = r.string("update")
    if update not in STATE_UPDATES:
        r.fail(f"update {update!r} is not one of {list(STATE_UPDATES)}")
    dtype = r.string("dtype")
    if dtype not in STATE_DTYPES:
        r.fail(f"dtype {dtype!r} is not one of {list(STATE_DTYPES)}")
    shape = tuple(r.get("shape", list))
    batch_axis = r.integer("batch_axis", 0)
    time_axis = r.integer("time_axis", 0, default=None)
    if update == "append" and time_axis is None:
        r.fail("an 'append' state needs a time_axis")
    if not all(d in ("batch", "source") or (isinstance(d, int) and not isinstance(d, bool) and d >= 0) for d in shape):
        r.fail(f"shape {list(shape)} must hold non-negative ints and the strings 'batch' and 'source'")
    if shape.count("source") > 1 or (time_axis is not None and "source" in shape):
        r.fail(f"shape {list(shape)} may say 'source' once, and only in a 'replace' state")
    if batch_axis >= len(shape) or shape[batch_axis] != "batch" or shape.count("batch") != 1:
        r.fail(f"shape {list(shape)} must say 'batch' exactly once, at batch_axis {batch_axis}")
    if time_axis is not None and (time_axis >= len(shape) or time_axis == batch_axis):
        r.fail(f"time_axis {time_axis} is not a non-batch axis of shape {list(shape)}")
    return StateSpec(
        input=r.string("input"),
        output=r.string("output"),
        update=update,
        batch_axis=batch_axis,
        time_axis=time_axis,
        dtype=dtype,
        shape=shape,
        init_from=_state_init(r),
    )


def _optional_tokens(r: FieldReader, key: str) -> Mapping[str, int]:
    """An optional language -> token id table (source_prefix, source_language_prefix, forced_first_token)."""
    return _decoder_start(r.obj(key)) if key in r.data else types.MappingProxyType({})


def _speech_translation(r: FieldReader) -> SpeechTranslationSpec | None:
    if "speech_translation" not in r.data:
        return None
    t = r.obj("speech_translation")
    return SpeechTranslationSpec(t.string("target"), _decoder_prompt(t, "prompt"))


def _decoder_prompt(r: FieldReader, key: str = "decoder_prompt") -> Mapping[str, tuple[int, ...]]:
    if key not in r.data:
        return types.MappingProxyType({})
    prompt = r.obj(key)
    table = {}
    for language, ids in prompt.data.items():
        if not (isinstance(ids, list) and ids and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)):
            prompt.fail_field(language, f"must be a non-empty list of token ids, got {ids!r}")
        table[language] = tuple(ids)
    return types.MappingProxyType(table)


def _word_timestamps(r: FieldReader, attention: FieldReader) -> WordTimestampsSpec | None:
    if "word_timestamps" not in r.data:
        return None
    w = r.obj("word_timestamps")
    layers, heads = attention.integer("layers", 1), attention.integer("heads", 1)
    pairs = w.get("alignment_heads", list)
    if not pairs or not all(isinstance(p, list) and len(p) == 2 and all(isinstance(i, int) for i in p)
                            and 0 <= p[0] < layers and 0 <= p[1] < heads for p in pairs):
        w.fail_field("alignment_heads", f"must be a non-empty list of [layer, head] within {layers} layers x "
                                        f"{heads} heads, got {pairs!r}")
    width = w.integer("median_filter_width", 1, default=WordTimestampsSpec.median_filter_width)
    if width % 2 == 0:
        w.fail_field("median_filter_width", f"must be odd, got {width}")
    return WordTimestampsSpec(tuple(tuple(p) for p in pairs), width)


def _state_init(r: FieldReader) -> str | None:
    init = r.get("init", (str, dict))
    if init == "zeros":
        return None
    if isinstance(init, dict) and isinstance(init.get("from"), str) and len(init) == 1:
        return init["from"]
    r.fail(f"init must be \"zeros\" or {{\"from\": \"<encoder output>\"}}, got {init!r}")


def _check_consistency(m: Manifest, where: str) -> None:
    """Cross-field checks: every target language has a start token; decoder inputs/outputs used once."""
    missing = [lang for lang in m.target_languages if lang not in m.decoder_start]
    if missing:
        raise ValueError(f"{where}: decoder_start has no token for target language(s) {missing}")
    if m.source_prefix and sorted(m.source_prefix) != sorted(m.target_languages):
        raise ValueError(f"{where}: source_prefix must name a token for every target language, and only those")
    if m.forced_first_token and sorted(m.forced_first_token) != sorted(m.target_languages):
        raise ValueError(f"{where}: forced_first_token must name a token for every target language, and only those")
    if m.decoder_prompt and sorted(m.decoder_prompt) != sorted(m.target_languages):
        raise ValueError(f"{where}: decoder_prompt must name tokens for every target language, and only those")
    if m.decoder_prompt and m.forced_first_token:
        raise ValueError(f"{where}: decoder_prompt and forced_first_token do not combine; put the forced token in the prompt")
    if m.detect_language and len({p[1:] for p in m.decoder_prompt.values()}) != 1:
        raise ValueError(f"{where}: detect_language needs a decoder_prompt whose languages differ only in its first token")
    t = m.speech_translation
    if t is not None and (t.target not in m.target_languages or not set(t.prompt) <= set(m.source_languages)):
        raise ValueError(f"{where}: speech_translation must name a target language and prompts of source languages")
    prompted = {i for p in [*m.decoder_prompt.values(), *(t.prompt.values() if t else ())] for i in p}
    if prompted & set(m.special_tokens.suppress):
        raise ValueError(f"{where}: special_tokens.suppress holds prompt token(s) {sorted(prompted & set(m.special_tokens.suppress))}")
    if m.source_language_prefix and sorted(m.source_language_prefix) != sorted(m.source_languages):
        raise ValueError(f"{where}: source_language_prefix must name a token for every source language, and only those")
    extra = [lang for lang in m.decoder_start if lang not in m.target_languages]
    if extra:
        raise ValueError(f"{where}: decoder_start names {extra}, which are not in languages.target")
    fed = [m.decoder.input_ids, m.decoder.position_ids, m.decoder.self_attention_mask]
    fed = [name for name in fed if name is not None]
    fed += [s.target for s in m.static] + [s.input for s in m.state]
    duplicates = sorted({name for name in fed if fed.count(name) > 1})
    if duplicates:
        raise ValueError(f"{where}: decoder input(s) {duplicates} are fed more than once (decoder.inputs/static/state)")
    outputs = [s.output for s in m.state] + [m.decoder.logits, m.attention.output]
    duplicates = sorted({name for name in outputs if outputs.count(name) > 1})
    if duplicates:
        raise ValueError(f"{where}: decoder output(s) {duplicates} are used more than once (state/logits/attention)")
