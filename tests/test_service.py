"""The gRPC edge: servicer, error mapping, health, reflection, metrics and shutdown.

Most tests serve a `FakeEngine` (a deterministic stand-in that reverses its input) in process; the
`real_server` tests serve the tiny random-weight model of the `tiny_model_repo` fixture and compare the
served result with the engine's own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import signal
import threading
import time

import grpc
import pytest
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from prometheus_client import REGISTRY

from attnserve.server import app, convert, generation
from attnserve.server.generation import GenerationResult, ModelInfo, Token
from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc

WAIT = 30  # seconds; only guards against hangs, never measures anything


class FakeEngine:
    """Stand-in for `engine.ModelEngine`: "translates" by reversing characters, one worker thread.

    Attributes a test may set: `gate` (clear it to hold the worker), `fail` (raised by the worker),
    `drop` (submit returns an already-cancelled future, as an engine that is closing would).
    """

    def __init__(self, name: str = "fake-translate"):
        languages = ["en", "zh-TW"]
        self.info = ModelInfo(name, 3, "translation", "reverses its input", languages, languages, 32, 8, 2, 4)
        self.gate = threading.Event()
        self.gate.set()
        self.fail: Exception | None = None
        self.drop = False
        self.closed = False
        self.requests: list[generation.GenerationRequest] = []
        self.futures: list[concurrent.futures.Future] = []
        self._worker = concurrent.futures.ThreadPoolExecutor(1)

    def submit(self, request, on_token=None):
        if request.target_language not in ("", *self.info.target_languages):
            raise ValueError(f"unknown target language {request.target_language!r}")
        self.requests.append(request)
        if self.drop:
            future = concurrent.futures.Future()
            future.cancel()
            return future
        future = self._worker.submit(self._generate, request, on_token)
        self.futures.append(future)
        return future

    def generate(self, request) -> GenerationResult:
        """The offline result: what `submit` computes, without a server."""
        return self._generate(request, None)

    def close(self):
        self.closed = True
        self._worker.shutdown(wait=True)

    def _generate(self, request, on_token) -> GenerationResult:
        self.gate.wait()
        if self.fail is not None:
            raise self.fail
        source = [Token(ch, ord(ch), 0.0) for ch in request.text] + [Token("</s>", 2, 0.0)]
        limit = request.decoding.max_new_tokens or self.info.max_new_tokens
        output = request.text[::-1][:limit]
        tokens = [Token(ch, ord(ch), -0.25 * (i + 1)) for i, ch in enumerate(output)]
        # Output token i copies source character n-1-i: a reversed diagonal.
        n = len(request.text)
        weights = [[1.0 if c == n - 1 - r else 0.0 for c in range(len(source))] for r in range(len(tokens))]
        for token, row in zip(tokens, weights):
            if on_token is not None:
                on_token(token, row)
        attention = generation.AttentionMatrix(
            weights, [t.piece for t in tokens], [t.piece for t in source], 1, "layer 1 of 2, fake"
        )
        return GenerationResult(
            model=self.info.name,
            text=output,
            target_language=request.target_language or "en",
            tokens=tokens,
            source_tokens=source,
            finish_reason=generation.FinishReason.LENGTH if len(output) < n else generation.FinishReason.EOS,
            attention=attention if request.attention.enabled else None,
            timings=generation.Timings(0.001, 0.002, 0.003, 0.004, 0.01, 1),
        )


@pytest.fixture(scope="module")
def fake_server():
    engine = FakeEngine()
    with app.BackgroundServer({engine.info.name: engine}) as background:
        yield background, engine


@pytest.fixture
def served(fake_server):
    """(stub, channel, engine) with the fake engine reset after the test."""
    background, engine = fake_server
    with grpc.insecure_channel(background.address) as channel:
        yield pb_grpc.AttnServeStub(channel), channel, engine
    engine.gate.set()
    engine.fail, engine.drop = None, False


def text_request(text="hello", **fields) -> pb.GenerateRequest:
    fields.setdefault("model", "fake-translate")
    return pb.GenerateRequest(text=pb.TextInput(text=text), **fields)


def with_attention(**options) -> pb.AttentionOptions:
    return pb.AttentionOptions(mode=pb.ATTENTION_MODE_AGGREGATED, **options)


def status_of(rpc, request, **kwargs) -> grpc.RpcError:
    """The error a unary or server-streaming call ends with."""
    with pytest.raises(grpc.RpcError) as raised:
        response = rpc(request, **kwargs)
        if not isinstance(response, Message):
            list(response)  # a stream fails while it is read
    return raised.value


def wait_until(predicate) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# ---- results ---------------------------------------------------------------------------------------


def test_served_result_is_the_engine_result(served):
    stub, _, engine = served
    request = text_request("我愛你", target_language="en", attention=with_attention(layer=0))
    response = stub.Generate(request, timeout=WAIT)
    offline = engine.generate(convert.request_from_proto(request))
    assert response == convert.result_to_proto(offline)
    assert response.attention.rows == 3 and response.attention.cols == 4


def test_stream_ends_with_the_unary_response_and_streams_its_tokens(served):
    stub, _, _ = served
    request = text_request("abcde", attention=with_attention())
    unary = stub.Generate(request, timeout=WAIT)
    *events, final = list(stub.GenerateStream(request, timeout=WAIT))
    assert final.WhichOneof("event") == "response" and final.response == unary
    assert all(e.WhichOneof("event") == "token" for e in events)
    assert [e.token.index for e in events] == list(range(len(unary.tokens)))
    assert [e.token.token for e in events] == list(unary.tokens)
    cols = unary.attention.cols
    assert [list(e.token.attention) for e in events] == [
        list(unary.attention.weights[r * cols : (r + 1) * cols]) for r in range(unary.attention.rows)
    ]


def test_stream_carries_no_attention_rows_unless_asked(served):
    stub, _, _ = served
    *events, final = list(stub.GenerateStream(text_request("abc"), timeout=WAIT))
    assert len(events) == 3 and all(len(e.token.attention) == 0 for e in events)
    assert not final.response.HasField("attention")


def test_request_options_reach_the_engine_unchanged(served):
    stub, _, engine = served
    request = text_request(
        "abc",
        target_language="zh-TW",
        decoding=pb.DecodingOptions(max_new_tokens=2, beam_size=3),
        attention=with_attention(layer=-2, granularity=pb.ATTENTION_GRANULARITY_WORDS),
        request_id="r-1",
    )
    stub.Generate(request, timeout=WAIT)
    assert engine.requests[-1] == generation.GenerationRequest(
        model="fake-translate",
        text="abc",
        target_language="zh-TW",
        decoding=generation.DecodingOptions(max_new_tokens=2, beam_size=3),
        attention=generation.AttentionOptions(True, -2, generation.AttentionGranularity.WORDS),
        request_id="r-1",
    )


def test_unset_options_mean_greedy_last_layer_pieces_no_attention(served):
    stub, _, engine = served
    stub.Generate(text_request("abc"), timeout=WAIT)
    assert engine.requests[-1].decoding == generation.DecodingOptions(max_new_tokens=0, beam_size=1)
    assert engine.requests[-1].attention == generation.AttentionOptions()


def test_list_and_get_model(served):
    stub, _, engine = served
    listed = stub.ListModels(pb.ListModelsRequest(), timeout=WAIT)
    assert [convert.model_info_from_proto(m) for m in listed.models] == [engine.info]
    assert convert.model_info_from_proto(stub.GetModel(pb.GetModelRequest(name="fake-translate"))) == engine.info


# ---- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_, code, message",
    [
        (pb.GenerateRequest(model="fake-translate"), grpc.StatusCode.INVALID_ARGUMENT, "missing input"),
        (text_request(model="nope"), grpc.StatusCode.INVALID_ARGUMENT, "unknown model 'nope'; available: fake-"),
        (text_request(target_language="fr"), grpc.StatusCode.INVALID_ARGUMENT, "unknown target language 'fr'"),
        (
            pb.GenerateRequest(model="fake-translate", text=pb.TextInput(text="a", source_language="de")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "unknown source language 'de'",
        ),
        (text_request(attention=pb.AttentionOptions(mode=7)), grpc.StatusCode.INVALID_ARGUMENT, "attention mode 7"),
        (
            text_request(attention=pb.AttentionOptions(granularity=9)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "attention granularity 9",
        ),
        (
            pb.GenerateRequest(model="fake-translate", audio=pb.AudioInput(data=b"RIFF")),
            grpc.StatusCode.UNIMPLEMENTED,
            "audio input is not served yet",
        ),
    ],
)
@pytest.mark.parametrize("rpc", ["Generate", "GenerateStream"])
def test_bad_requests_are_rejected_with_a_message(served, rpc, request_, code, message):
    stub, _, _ = served
    error = status_of(getattr(stub, rpc), request_, timeout=WAIT)
    assert error.code() == code
    assert message in error.details()


def test_get_unknown_model_is_invalid_argument(served):
    stub, _, _ = served
    error = status_of(stub.GetModel, pb.GetModelRequest(name="nope"), timeout=WAIT)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "unknown model 'nope'; available: fake-translate"


@pytest.mark.parametrize(
    "exc, code",
    [
        (ValueError("source is too long"), grpc.StatusCode.INVALID_ARGUMENT),
        (NotImplementedError("beam search"), grpc.StatusCode.UNIMPLEMENTED),
        (generation.OverloadedError("queue full"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (generation.UnavailableError("closing"), grpc.StatusCode.UNAVAILABLE),
        (TimeoutError("too slow"), grpc.StatusCode.DEADLINE_EXCEEDED),
        (RuntimeError("broken invariant"), grpc.StatusCode.INTERNAL),
        (KeyError("oops"), grpc.StatusCode.INTERNAL),
    ],
)
@pytest.mark.parametrize("rpc", ["Generate", "GenerateStream"])
def test_engine_exceptions_map_to_status_codes(served, rpc, exc, code):
    stub, _, engine = served
    engine.fail = exc
    error = status_of(getattr(stub, rpc), text_request(), timeout=WAIT)
    assert (error.code(), error.details()) == (code, str(exc))


def test_internal_errors_log_one_traceback(served, caplog):
    stub, _, engine = served
    engine.fail = RuntimeError("broken invariant")
    with caplog.at_level(logging.INFO, logger="attnserve.server"):
        status_of(stub.Generate, text_request(), timeout=WAIT)
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1 and "Generate" in tracebacks[0].getMessage()


def test_request_dropped_by_the_engine_is_unavailable(served):
    stub, _, engine = served
    engine.drop = True
    error = status_of(stub.Generate, text_request(), timeout=WAIT)
    assert error.code() == grpc.StatusCode.UNAVAILABLE


# ---- cancellation and deadlines ----------------------------------------------------------------------


def _hold_worker(stub, engine) -> grpc.Future:
    """Blocks the fake's only worker with one request, so that the next one stays queued."""
    engine.gate.clear()
    running = stub.Generate.future(text_request("first"), timeout=WAIT)
    wait_until(lambda: engine.futures and engine.futures[-1].running())
    return running


def test_client_cancel_drops_the_queued_request(served):
    stub, _, engine = served
    running = _hold_worker(stub, engine)
    count = len(engine.futures)
    stream = stub.GenerateStream(text_request("second"), timeout=WAIT)
    wait_until(lambda: len(engine.futures) > count)
    queued = engine.futures[-1]
    stream.cancel()
    dropped = threading.Event()
    queued.add_done_callback(lambda _: dropped.set())
    assert dropped.wait(WAIT) and queued.cancelled()
    engine.gate.set()
    assert running.result(timeout=WAIT).text == "tsrif"


def test_deadline_drops_the_queued_request(served):
    stub, _, engine = served
    running = _hold_worker(stub, engine)
    error = status_of(stub.Generate, text_request("second"), timeout=0.5)
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    dropped = threading.Event()
    engine.futures[-1].add_done_callback(lambda _: dropped.set())
    assert dropped.wait(WAIT) and engine.futures[-1].cancelled()
    engine.gate.set()
    running.result(timeout=WAIT)


# ---- health, reflection, metrics -----------------------------------------------------------------------


@pytest.mark.parametrize("service", ["", "attnserve.v1.AttnServe"])
def test_health_is_serving(served, service):
    _, channel, _ = served
    health = health_pb2_grpc.HealthStub(channel)
    response = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=WAIT)
    assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_the_services(served):
    _, channel, _ = served
    services = ProtoReflectionDescriptorDatabase(channel).get_services()
    assert {"attnserve.v1.AttnServe", "grpc.health.v1.Health"} <= set(services)


def _sample(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_metrics_count_requests_by_model_and_code(served):
    stub, _, _ = served
    ok = {"model": "fake-translate", "code": "OK"}
    bad = {"model": "fake-translate", "code": "INVALID_ARGUMENT"}
    unknown = {"model": "", "code": "INVALID_ARGUMENT"}
    before = [_sample("attnserve_requests_total", **labels) for labels in (ok, bad, unknown)]
    durations = _sample("attnserve_request_duration_seconds_count", model="fake-translate")
    batch_sizes = _sample("attnserve_batch_size_sum", model="fake-translate")

    stub.Generate(text_request(), timeout=WAIT)
    list(stub.GenerateStream(text_request(), timeout=WAIT))
    status_of(stub.Generate, text_request(target_language="fr"), timeout=WAIT)
    status_of(stub.Generate, text_request(model="x" * 40), timeout=WAIT)

    after = [_sample("attnserve_requests_total", **labels) for labels in (ok, bad, unknown)]
    assert [a - b for a, b in zip(after, before)] == [2, 1, 1]
    assert _sample("attnserve_request_duration_seconds_count", model="fake-translate") == durations + 2
    assert _sample("attnserve_batch_size_sum", model="fake-translate") == batch_sizes + 2


# ---- shutdown --------------------------------------------------------------------------------------


def test_sigterm_sets_not_serving_then_stops_and_closes_engines():
    engine = FakeEngine()

    async def scenario() -> list[int]:
        server = await app.start({engine.info.name: engine}, "127.0.0.1:0")
        serving = asyncio.create_task(app.serve_until_signal(server, grace=WAIT))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
            statuses = [(await watch.read()).status]
            os.kill(os.getpid(), signal.SIGTERM)
            statuses.append((await watch.read()).status)
            watch.cancel()  # an open Watch would otherwise hold the server for the whole grace period
        await asyncio.wait_for(serving, WAIT)
        return statuses

    statuses = asyncio.run(scenario())
    assert statuses == [health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING]
    assert engine.closed


# ---- the real engine -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_server(request):
    pytest.importorskip("attnserve.server.engine")
    try:
        repo = request.getfixturevalue("tiny_model_repo")
    except pytest.FixtureLookupError:
        pytest.skip("tests/conftest.py does not provide tiny_model_repo yet")
    engines = app.load_engines(app.ServeOptions(models=str(repo)))
    with app.BackgroundServer(engines) as background, grpc.insecure_channel(background.address) as channel:
        yield pb_grpc.AttnServeStub(channel), engines


def _without_timings(response: pb.GenerateResponse) -> pb.GenerateResponse:
    response = type(response).FromString(response.SerializeToString())
    response.ClearField("timings")
    return response


def _tiny_request(real_server, **fields) -> pb.GenerateRequest:
    _, engines = real_server
    fields.setdefault("model", "tiny-translate" if "tiny-translate" in engines else sorted(engines)[0])
    fields.setdefault("text", pb.TextInput(text="hello world"))
    return pb.GenerateRequest(**fields)


def test_real_served_equals_offline(real_server):
    stub, engines = real_server
    request = _tiny_request(real_server, target_language="en", attention=with_attention())
    served_ = stub.Generate(request, timeout=WAIT)
    offline = engines[request.model].submit(convert.request_from_proto(request)).result(timeout=WAIT)
    assert _without_timings(served_) == _without_timings(convert.result_to_proto(offline))


def test_real_stream_equals_unary(real_server):
    stub, _ = real_server
    request = _tiny_request(real_server, attention=with_attention(granularity=pb.ATTENTION_GRANULARITY_WORDS))
    unary = stub.Generate(request, timeout=WAIT)
    *events, final = list(stub.GenerateStream(request, timeout=WAIT))
    assert _without_timings(final.response) == _without_timings(unary)
    assert [e.token.token for e in events] == list(final.response.tokens)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"text": pb.TextInput(text="")}, "empty"),
        ({"model": "nope"}, "nope"),
        ({"target_language": "fr"}, "fr"),
        ({"text": pb.TextInput(text="hello " * 2000)}, "long"),
        ({"decoding": pb.DecodingOptions(max_new_tokens=100000)}, "100000"),
        ({"decoding": pb.DecodingOptions(max_new_tokens=-1)}, "-1"),
        ({"text": None}, "missing input"),
    ],
)
def test_real_bad_inputs_are_invalid_argument(real_server, fields, message):
    stub, _ = real_server
    request = _tiny_request(real_server, **fields)
    error = status_of(stub.Generate, request, timeout=WAIT)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in error.details()
