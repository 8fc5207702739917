"""Property-based fuzzing of requests: whatever a client sends, the answer is success, INVALID_ARGUMENT,
OUT_OF_RANGE or NOT_FOUND (a model it does not have), never a server error, and the server stays healthy.

Most cases run in process along the server's own path (the admission check on the raw bytes, parsing, the
servicer's checks and conversion, the engine's validation), which is fast enough for thousands of cases;
a smaller set goes over gRPC to the tiny model and is decoded for real.
"""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnserve.server.edge import app, errors, service
from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from fakes import WAIT

ALLOWED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.NOT_FOUND}
GENERATE = "/attnserve.v1.AttnServe/Generate"
SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field, written by hand so that it may hold invalid UTF-8."""
    length, out = len(payload), bytearray()
    out += _varint(number << 3 | 2)
    out += _varint(length)
    return bytes(out) + payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


texts = st.one_of(
    st.text(max_size=80),
    st.text(alphabet=st.sampled_from("\u200b\ufeff\x00\u2060 \t\n\u200d"), max_size=20),
    st.integers(1, 40_000).map(lambda n: "知" * n),  # around and far past the length limit
)
raw_text_bytes = st.one_of(
    texts.map(lambda t: t.encode()),
    st.binary(max_size=64),  # invalid UTF-8, encoded surrogates ("\xed\xa0\x80"), truncations
)


@st.composite
def requests(draw, models: list[str]) -> bytes:
    """A serialized GenerateRequest: random input of any kind, options in and out of range."""
    message = pb.GenerateRequest(
        model=draw(st.sampled_from([*models, "", "nope", "x" * 300])),
        target_language=draw(st.sampled_from(["", "en", "zh-TW", "fr", "\u200b"])),
        decoding=pb.DecodingOptions(
            max_new_tokens=draw(st.integers(-3, 300)), beam_size=draw(st.integers(-3, 20))
        ),
        attention=pb.AttentionOptions(
            mode=draw(st.integers(0, 4)), granularity=draw(st.integers(0, 4)), layer=draw(st.integers(-4, 4))
        ),
        request_id=draw(st.text(max_size=10)),
    )
    kind = draw(st.sampled_from(["text", "audio", "image", "none", "source_language"]))
    if kind == "audio":
        audio = pb.AudioInput(data=draw(st.binary(max_size=2000)), sample_rate_hz=draw(st.integers(-10, 100_000)))
        audio.samples.extend(draw(st.lists(st.floats(width=32), max_size=50)))
        message.audio.CopyFrom(audio)
    elif kind == "image":
        message.image.CopyFrom(pb.ImageInput(data=draw(st.binary(max_size=200))))
    elif kind == "source_language":
        message.text.CopyFrom(pb.TextInput(text=draw(texts), source_language=draw(st.sampled_from(["en", "xx"]))))
    data = message.SerializeToString()
    if kind == "text":
        data += _field(2, _field(1, draw(raw_text_bytes)))  # TextInput.text, possibly not UTF-8
    return data


@pytest.fixture(scope="module")
def served_engines(tiny_server, tiny_speech_repo):
    """The tiny text model and the tiny speech model, with the server's admission check of both."""
    _, engines = tiny_server
    speech = app.load_engines(app.ServeOptions(models=str(tiny_speech_repo)))
    everything = {**engines, **speech}
    yield everything, app._message_limits(everything)
    for engine in speech.values():
        engine.close()


def _validate(engines, message_limits, data: bytes) -> None:
    """What the server does with a request before queueing it, in its order."""
    message_limits.check(data)
    try:
        message = pb.GenerateRequest.FromString(data)
    except Exception as exc:  # as the error interceptor reports it
        raise ValueError(f"the request cannot be parsed: {exc}") from exc
    engine, request = service.AttnServeServicer(engines)._prepare(message)
    engine.prepare(request)


@settings(max_examples=2000, **SETTINGS)
@given(data=st.data())
def test_validation_answers_only_invalid_argument_out_of_range_or_accepts(served_engines, data):
    engines, message_limits = served_engines
    request = data.draw(requests(sorted(engines)))
    try:
        _validate(engines, message_limits, request)
    except Exception as exc:
        assert errors.status_code(exc) in ALLOWED, f"{type(exc).__name__}: {exc}"


@pytest.fixture(scope="module")
def channel(tiny_server):
    background, _ = tiny_server
    with grpc.insecure_channel(background.address) as channel:
        yield channel


@settings(max_examples=120, **SETTINGS)
@given(data=st.data())
def test_served_requests_end_in_success_or_a_client_error(channel, tiny_server, data):
    _, engines = tiny_server
    request = data.draw(requests(sorted(engines)))
    generate = channel.unary_unary(GENERATE, request_serializer=lambda b: b, response_deserializer=lambda b: b)
    # Past the largest request any served model accepts, gRPC itself refuses the message, unread.
    allowed = ALLOWED | ({grpc.StatusCode.RESOURCE_EXHAUSTED} if len(request) > receive_limit(tiny_server) else set())
    try:
        generate(request, timeout=WAIT)
    except grpc.RpcError as error:
        assert error.code() in allowed, f"{error.code()}: {error.details()[:300]}"


def receive_limit(tiny_server) -> int:
    background, _ = tiny_server
    return background.server.limits.receive_bytes


def test_the_server_is_healthy_after_the_fuzzing(channel):
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=WAIT)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    request = pb.GenerateRequest(model="tiny-translate", text=pb.TextInput(text="hello"))
    assert pb_grpc.AttnServeStub(channel).Generate(request, timeout=WAIT).tokens
