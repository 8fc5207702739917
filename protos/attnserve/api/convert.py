"""Protobuf <-> dataclass conversion: the one place where the wire format meets the serving core's types.

The servicer converts each request once on the way in and each result once on the way out; the clients
do the reverse with the same functions, so both ends agree on every default by construction. This module
imports only protobuf stubs and `generation`, never grpc or the runtime, so clients can use it; numpy only
where raw audio samples are converted, so the client distribution (clients/standalone/) needs none.
"""

from __future__ import annotations

import dataclasses

from attnserve.api import generation as gen
from attnserve.v1 import attnserve_pb2 as pb

# Wire constants shared by the server and the clients.
DEFAULT_PORT = 50051
# Large enough for a 256 x 256 attention matrix many times over and for the audio inputs to come;
# gRPC's 4 MiB default receive limit would be the first thing to break for long audio.
MAX_MESSAGE_BYTES = 32 * 1024 * 1024
# What a client may send: a long-form recording up to the servers' default long_form_max_bytes (128 MiB,
# server/engine/longform.py) with room for the request around it. Each server refuses what its models cannot use.
MAX_REQUEST_BYTES = 160 * 1024 * 1024

_FINISH_REASONS = {
    gen.FinishReason.EOS: pb.FINISH_REASON_EOS,
    gen.FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
}
_GRANULARITIES = {
    gen.AttentionGranularity.PIECES: pb.ATTENTION_GRANULARITY_PIECES,
    gen.AttentionGranularity.WORDS: pb.ATTENTION_GRANULARITY_WORDS,
}
_REDUCTIONS = {
    gen.AttentionReduction.MEAN: pb.ATTENTION_REDUCTION_MEAN,
    gen.AttentionReduction.MAX: pb.ATTENTION_REDUCTION_MAX,
}
_INPUT_KINDS = {
    gen.InputKind.TEXT: pb.INPUT_KIND_TEXT,
    gen.InputKind.AUDIO: pb.INPUT_KIND_AUDIO,
    gen.InputKind.IMAGE: pb.INPUT_KIND_IMAGE,
    gen.InputKind.VIDEO: pb.INPUT_KIND_VIDEO,
}


# ---- requests ----------------------------------------------------------------------------------------


def request_from_proto(msg: pb.GenerateRequest) -> gen.GenerationRequest:
    """Converts a request, whichever input it carries (the engine checks it is the model's kind).

    Raises:
        ValueError: an enum field holds a value this server does not know.
    """
    options = msg.attention
    if options.mode not in (pb.ATTENTION_MODE_UNSPECIFIED, pb.ATTENTION_MODE_NONE, pb.ATTENTION_MODE_AGGREGATED):
        raise ValueError(f"unknown attention mode {options.mode}")
    kind = msg.WhichOneof("input")
    return gen.GenerationRequest(
        model=msg.model,
        text=msg.text.text if kind == "text" else "",
        source_language={"text": msg.text.source_language, "audio": msg.audio.source_language}.get(kind, ""),
        audio=_audio_from_proto(msg.audio) if kind == "audio" else None,
        image=gen.ImageInput(msg.image.data) if kind == "image" else None,
        video=gen.VideoInput(msg.video.data, tuple(msg.video.frames), msg.video.frames_per_second)
        if kind == "video" else None,
        target_language=msg.target_language,
        decoding=_decoding_from_proto(msg.decoding),
        attention=gen.AttentionOptions(
            enabled=options.mode == pb.ATTENTION_MODE_AGGREGATED,
            layer=options.layer if options.HasField("layer") else None,
            granularity=_enum_from_proto(
                options.granularity, _GRANULARITIES, gen.AttentionGranularity.PIECES, "attention granularity"
            ),
            heads=tuple(options.heads),
            reduction=_enum_from_proto(
                options.reduction, _REDUCTIONS, gen.AttentionReduction.MEAN, "attention reduction"
            ),
        ),
        request_id=msg.request_id,
    )


def request_to_proto(request: gen.GenerationRequest, source_language: str | None = None) -> pb.GenerateRequest:
    """Converts a request to its wire form; `source_language` (text; the request's own also for audio) is
    optional on the wire only.

    Raises:
        ValueError: the request carries more than one input (the wire's `input` holds one).
    """
    if len(request.input_kinds) > 1:
        kinds = " and ".join(k.value for k in request.input_kinds)
        raise ValueError(f"a request carries one input; this one has {kinds}")
    attention = request.attention
    inputs = {}
    if request.audio is not None:
        inputs["audio"] = _audio_to_proto(request.audio)
        if request.source_language:  # the spoken language (speech translation)
            inputs["audio"].source_language = request.source_language
    if request.image is not None:
        inputs["image"] = pb.ImageInput(data=request.image.data)
    if request.video is not None:
        v = request.video
        inputs["video"] = pb.VideoInput(data=v.data, frames=list(v.frames), frames_per_second=v.frames_per_second)
    if request.text or not inputs:
        inputs["text"] = pb.TextInput(text=request.text, source_language=source_language or request.source_language or None)
    return pb.GenerateRequest(
        model=request.model,
        **inputs,
        target_language=request.target_language,
        decoding=_decoding_to_proto(request.decoding),
        attention=pb.AttentionOptions(
            mode=pb.ATTENTION_MODE_AGGREGATED if attention.enabled else pb.ATTENTION_MODE_NONE,
            layer=attention.layer,
            granularity=_GRANULARITIES[attention.granularity],
            heads=attention.heads,
            reduction=_REDUCTIONS[attention.reduction],
        ),
        request_id=request.request_id,
    )


def _decoding_from_proto(msg: pb.DecodingOptions) -> gen.DecodingOptions:
    sampling = None
    if msg.HasField("sampling"):
        wire = msg.sampling
        sampling = gen.SamplingOptions(
            temperature=wire.temperature if wire.HasField("temperature") else 1.0,
            top_k=wire.top_k,
            top_p=wire.top_p if wire.HasField("top_p") else 1.0,
            seed=wire.seed if wire.HasField("seed") else None,
        )
    return gen.DecodingOptions(
        max_new_tokens=msg.max_new_tokens,
        # proto3 cannot tell 0 from unset: 0 beams means the model's default; 0 sequences means 1.
        beam_size=msg.beam_size,
        num_return_sequences=msg.num_return_sequences or 1,
        min_new_tokens=msg.min_new_tokens,
        no_repeat_ngram_size=msg.no_repeat_ngram_size,
        sampling=sampling,
        reverse_weight=msg.reverse_weight,
        glossary=tuple(sorted(msg.glossary.items())),
        use_default_glossary=msg.use_default_glossary,
        read_once=msg.read_once,
        hotwords=tuple(msg.hotwords),
        hotword_boost=msg.hotword_boost,
    )


def _decoding_to_proto(options: gen.DecodingOptions) -> pb.DecodingOptions:
    sampling = None
    if options.sampling is not None:
        sampling = pb.SamplingOptions(**dataclasses.asdict(options.sampling))  # None fields stay unset
    return pb.DecodingOptions(
        max_new_tokens=options.max_new_tokens,
        beam_size=options.beam_size,
        num_return_sequences=options.num_return_sequences,
        min_new_tokens=options.min_new_tokens,
        no_repeat_ngram_size=options.no_repeat_ngram_size,
        sampling=sampling,
        reverse_weight=options.reverse_weight,
        glossary=dict(options.glossary),
        use_default_glossary=options.use_default_glossary,
        read_once=options.read_once,
        hotwords=list(options.hotwords),
        hotword_boost=options.hotword_boost,
    )


def _audio_from_proto(msg: pb.AudioInput) -> gen.AudioInput:
    import numpy as np  # here, not at the top: see the module docstring

    samples = np.array(msg.samples, dtype=np.float32) if len(msg.samples) else None
    return gen.AudioInput(wav=msg.data, samples=samples, sample_rate_hz=msg.sample_rate_hz)


def _audio_to_proto(audio: gen.AudioInput) -> pb.AudioInput:
    samples = []
    if audio.samples is not None:  # raw samples: an array, so numpy is installed (a WAV file needs none)
        import numpy as np

        samples = np.asarray(audio.samples, dtype=np.float32).tolist()
    return pb.AudioInput(data=audio.wav, samples=samples, sample_rate_hz=audio.sample_rate_hz)


def _enum_from_proto(value: int, table: dict, unset, what: str):
    """The server's enum member for a wire value (0 = unset = `unset`); unknown values are a ValueError."""
    if value == 0:
        return unset
    for member, wire in table.items():
        if wire == value:
            return member
    raise ValueError(f"unknown {what} {value}")


# ---- results -----------------------------------------------------------------------------------------


def result_to_proto(result: gen.GenerationResult) -> pb.GenerateResponse:
    """Converts a finished result to its wire form."""
    timings = result.timings
    return pb.GenerateResponse(
        model=result.model,
        text=result.text,
        target_language=result.target_language,
        tokens=[token_to_proto(t) for t in result.tokens],
        source_tokens=[token_to_proto(t) for t in result.source_tokens],
        finish_reason=_FINISH_REASONS[result.finish_reason],
        attention=None if result.attention is None else attention_to_proto(result.attention),
        timings=pb.Timings(**dataclasses.asdict(timings)),  # the message mirrors the dataclass field by field
        words=[word_to_proto(w) for w in result.words],
        nbest=[_scored_to_proto(s) for s in result.nbest],
        segments=[segment_to_proto(s) for s in result.segments],
        glossary=[pb.GlossaryPlacement(**dataclasses.asdict(g)) for g in result.glossary],
        frames=[pb.FrameAttention(**dataclasses.asdict(f)) for f in result.frames],
    )


def result_from_proto(msg: pb.GenerateResponse) -> gen.GenerationResult:
    """Converts a wire response back to a result.

    Raises:
        ValueError: the response is malformed (unknown finish reason, weights that do not fill the matrix).
    """
    finish = {wire: reason for reason, wire in _FINISH_REASONS.items()}.get(msg.finish_reason)
    if finish is None:
        raise ValueError(f"unknown finish reason {msg.finish_reason}")
    timings = msg.timings
    return gen.GenerationResult(
        model=msg.model,
        text=msg.text,
        target_language=msg.target_language,
        tokens=[token_from_proto(token) for token in msg.tokens],
        source_tokens=[token_from_proto(token) for token in msg.source_tokens],
        finish_reason=finish,
        attention=attention_from_proto(msg.attention) if msg.HasField("attention") else None,
        timings=gen.Timings(**{f.name: getattr(timings, f.name) for f in dataclasses.fields(gen.Timings)}),
        words=[word_from_proto(w) for w in msg.words],
        nbest=[_scored_from_proto(s) for s in msg.nbest],
        segments=[segment_from_proto(s) for s in msg.segments],
        glossary=[_fields(gen.GlossaryPlacement, g) for g in msg.glossary],
        frames=[gen.FrameAttention(f.word, list(f.timeline), list(f.frame_seconds), f.peak_frame, list(f.heatmap))
                for f in msg.frames],
    )


def word_to_proto(word: gen.WordTiming) -> pb.WordTiming:
    return pb.WordTiming(word=word.word, start_seconds=word.start_seconds, end_seconds=word.end_seconds,
                         confidence=word.confidence)


def word_from_proto(msg: pb.WordTiming) -> gen.WordTiming:
    return gen.WordTiming(msg.word, msg.start_seconds, msg.end_seconds,
                          msg.confidence if msg.HasField("confidence") else None)


def segment_to_proto(segment: gen.TranscriptSegment) -> pb.TranscriptSegment:
    return pb.TranscriptSegment(
        index=segment.index,
        count=segment.count,
        start_seconds=segment.start_seconds,
        end_seconds=segment.end_seconds,
        text=segment.text,
        words=[word_to_proto(w) for w in segment.words],
        finish_reason=_FINISH_REASONS[segment.finish_reason],
    )


def segment_from_proto(msg: pb.TranscriptSegment) -> gen.TranscriptSegment:
    """Raises: ValueError: an unknown finish reason."""
    finish = {wire: reason for reason, wire in _FINISH_REASONS.items()}.get(msg.finish_reason)
    if finish is None:
        raise ValueError(f"unknown finish reason {msg.finish_reason}")
    words = [word_from_proto(w) for w in msg.words]
    return gen.TranscriptSegment(msg.index, msg.count, msg.start_seconds, msg.end_seconds, msg.text, words, finish)


def _scored_to_proto(sequence: gen.ScoredSequence) -> pb.ScoredSequence:
    return pb.ScoredSequence(
        text=sequence.text,
        tokens=[token_to_proto(t) for t in sequence.tokens],
        score=sequence.score,
        finish_reason=_FINISH_REASONS[sequence.finish_reason],
    )


def _scored_from_proto(msg: pb.ScoredSequence) -> gen.ScoredSequence:
    finish = {wire: reason for reason, wire in _FINISH_REASONS.items()}.get(msg.finish_reason)
    if finish is None:
        raise ValueError(f"unknown finish reason {msg.finish_reason}")
    return gen.ScoredSequence(msg.text, [token_from_proto(t) for t in msg.tokens], msg.score, finish)


def token_to_proto(token: gen.Token) -> pb.Token:
    return pb.Token(piece=token.piece, id=token.id, logprob=token.logprob)


def token_from_proto(msg: pb.Token) -> gen.Token:
    return gen.Token(piece=msg.piece, id=msg.id, logprob=msg.logprob)


def attention_to_proto(matrix: gen.AttentionMatrix) -> pb.AttentionMatrix:
    """Packs the nested weights row-major.

    Raises:
        RuntimeError: the core produced a ragged matrix or labels that do not match its shape.
    """
    rows, cols, explanation = len(matrix.row_labels), len(matrix.col_labels), matrix.explanation
    if len(matrix.weights) != rows or any(len(row) != cols for row in matrix.weights):
        raise RuntimeError(f"attention weights do not match the {rows} x {cols} labels")
    return pb.AttentionMatrix(
        rows=rows,
        cols=cols,
        weights=[w for row in matrix.weights for w in row],
        row_labels=matrix.row_labels,
        col_labels=matrix.col_labels,
        layer=matrix.layer,
        reduction=matrix.reduction,
        explanation=None if explanation is None else pb.AttentionExplanation(**dataclasses.asdict(explanation)),
    )


def attention_from_proto(msg: pb.AttentionMatrix) -> gen.AttentionMatrix:
    """Unpacks the row-major weights.

    Raises:
        ValueError: the weights or labels do not fill `rows` x `cols`.
    """
    rows, cols = msg.rows, msg.cols
    if len(msg.weights) != rows * cols or len(msg.row_labels) != rows or len(msg.col_labels) != cols:
        raise ValueError(
            f"attention matrix is {rows} x {cols} but carries {len(msg.weights)} weights, "
            f"{len(msg.row_labels)} row labels and {len(msg.col_labels)} column labels"
        )
    flat = list(msg.weights)
    return gen.AttentionMatrix(
        weights=[flat[r * cols : (r + 1) * cols] for r in range(rows)],
        row_labels=list(msg.row_labels),
        col_labels=list(msg.col_labels),
        layer=msg.layer,
        reduction=msg.reduction,
        explanation=_explanation_from_proto(msg.explanation) if msg.HasField("explanation") else None,
    )


def _explanation_from_proto(msg: pb.AttentionExplanation) -> gen.AttentionExplanation:
    return gen.AttentionExplanation(
        alignment=list(msg.alignment),
        coverage=list(msg.coverage),
        entropy=list(msg.entropy),
        neglected=list(msg.neglected),
        neglect_threshold=msg.neglect_threshold,
    )


# ---- streams -----------------------------------------------------------------------------------------


def token_event_to_proto(event: gen.StreamedToken) -> pb.GenerateStreamResponse:
    return pb.GenerateStreamResponse(token=_token_event(event))


def token_events_to_proto(events: list[gen.StreamedToken | gen.TranscriptSegment]) -> pb.GenerateStreamResponse:
    """One stream message for consecutive tokens: a TokenEvent for one, a TokenBatch for more; or for a
    long-form request's segment (always alone), a TranscriptSegment."""
    if len(events) == 1 and isinstance(events[0], gen.TranscriptSegment):
        return segment_event_to_proto(events[0])
    if len(events) == 1:
        return token_event_to_proto(events[0])
    return pb.GenerateStreamResponse(tokens=pb.TokenBatch(tokens=[_token_event(e) for e in events]))


def _token_event(event: gen.StreamedToken) -> pb.TokenEvent:
    return pb.TokenEvent(
        index=event.index, token=token_to_proto(event.token), attention=event.attention or [], text=event.text
    )


def segment_event_to_proto(segment: gen.TranscriptSegment) -> pb.GenerateStreamResponse:
    return pb.GenerateStreamResponse(segment=segment_to_proto(segment))


def final_to_proto(result: gen.GenerationResult) -> pb.GenerateStreamResponse:
    return pb.GenerateStreamResponse(response=result_to_proto(result))


def stream_events_from_proto(
    msg: pb.GenerateStreamResponse,
) -> list[gen.StreamedToken | gen.TranscriptSegment] | gen.GenerationResult:
    """Converts one stream message to its `StreamedToken`s (one, or a batch's), a long-form request's
    transcribed segment, or, for the final message, the result.

    Raises:
        ValueError: the message carries none of them.
    """
    kind = msg.WhichOneof("event")
    if kind == "token":
        return [_streamed_token(msg.token)]
    if kind == "tokens":
        return [_streamed_token(event) for event in msg.tokens.tokens]
    if kind == "segment":
        return [segment_from_proto(msg.segment)]
    if kind == "response":
        return result_from_proto(msg.response)
    raise ValueError("stream message carries neither tokens, a segment nor a response")


def _streamed_token(event: pb.TokenEvent) -> gen.StreamedToken:
    # A row always has a column for the source's EOS, so an empty one means none was sent.
    return gen.StreamedToken(event.index, token_from_proto(event.token), list(event.attention) or None, event.text)


# ---- models ------------------------------------------------------------------------------------------


_INPUT_FIELDS = ("input_kind", "audio", "image", "video")


def model_info_to_proto(info: gen.ModelInfo) -> pb.ModelInfo:
    # The other fields are scalars and lists with same-named wire fields.
    values = {f.name: getattr(info, f.name) for f in dataclasses.fields(info) if f.name not in _INPUT_FIELDS}
    return pb.ModelInfo(
        **values,
        input_kind=_INPUT_KINDS[info.input_kind],
        audio=None if info.audio is None else pb.AudioInputInfo(**dataclasses.asdict(info.audio)),
        image=None if info.image is None else pb.ImageInputInfo(**dataclasses.asdict(info.image)),
        video=None if info.video is None else pb.VideoInputInfo(**dataclasses.asdict(info.video)),
    )


def model_info_from_proto(msg: pb.ModelInfo) -> gen.ModelInfo:
    """Converts a wire ModelInfo; one without an input kind (an older server) describes a text model.

    Raises:
        ValueError: an input kind this client does not know.
    """
    values = {f.name: getattr(msg, f.name) for f in dataclasses.fields(gen.ModelInfo) if f.name not in _INPUT_FIELDS}
    values["source_languages"] = list(values["source_languages"])
    values["target_languages"] = list(values["target_languages"])
    kinds = {wire: kind for kind, wire in _INPUT_KINDS.items()} | {pb.INPUT_KIND_UNSPECIFIED: gen.InputKind.TEXT}
    if msg.input_kind not in kinds:
        raise ValueError(f"unknown input kind {msg.input_kind}")
    return gen.ModelInfo(
        **values,
        input_kind=kinds[msg.input_kind],
        audio=_audio_info_from_proto(msg.audio) if msg.HasField("audio") else None,
        image=_fields(gen.ImageInputInfo, msg.image) if msg.HasField("image") else None,
        video=_fields(gen.VideoInputInfo, msg.video) if msg.HasField("video") else None,
    )


def _audio_info_from_proto(msg: pb.AudioInputInfo) -> gen.AudioInputInfo:
    return dataclasses.replace(_fields(gen.AudioInputInfo, msg), formats=tuple(msg.formats), speeds=tuple(msg.speeds))


def _fields(cls, msg):
    """The dataclass `cls` from a message with a same-named field for each of its fields."""
    return cls(**{f.name: getattr(msg, f.name) for f in dataclasses.fields(cls)})
