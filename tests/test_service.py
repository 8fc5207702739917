"""The gRPC edge: servicer, error mapping, cancellation, health, reflection, metrics and shutdown.

Most tests serve a `FakeEngine` (a deterministic stand-in that reverses its input, tests/fakes.py) in
process; the `real_server` tests serve the tiny random-weight model of the `tiny_model_repo` fixture and
compare the served result with the engine's own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import signal
import socket
import threading
import time
import types

import grpc
import numpy as np
import pytest
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from prometheus_client import REGISTRY

from attnserve.api import convert, generation
from attnserve.server.edge import app, metrics
from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from fakes import WAIT, FakeEngine, recording_engine


@pytest.fixture
def served(fake_server, fake_engine):
    """(stub, channel, engine) on the module's fake server; the engine is reset after the test."""
    background, _ = fake_server
    with grpc.insecure_channel(background.address) as channel:
        yield pb_grpc.AttnServeStub(channel), channel, fake_engine


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


def test_unset_options_mean_the_models_search_last_layer_pieces_no_attention(served):
    stub, _, engine = served
    stub.Generate(text_request("abc"), timeout=WAIT)
    # beam_size 0: the engine resolves it to the model's default search (ModelInfo.default_beam_size)
    assert engine.requests[-1].decoding == generation.DecodingOptions(max_new_tokens=0, beam_size=0)
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
        (text_request(model="nope"), grpc.StatusCode.NOT_FOUND, "unknown model 'nope'; available: fake-"),
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
            text_request(attention=pb.AttentionOptions(mode=pb.ATTENTION_MODE_AGGREGATED, reduction=5)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "attention reduction 5",
        ),
        (
            pb.GenerateRequest(model="fake-translate", audio=pb.AudioInput(data=b"RIFF")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "model 'fake-translate' takes text input, not audio",
        ),
        (
            pb.GenerateRequest(model="fake-translate", image=pb.ImageInput(data=b"\x89PNG")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "model 'fake-translate' takes text input, not image",
        ),
    ],
)
@pytest.mark.parametrize("rpc", ["Generate", "GenerateStream"])
def test_bad_requests_are_rejected_with_a_message(served, rpc, request_, code, message):
    stub, _, _ = served
    error = status_of(getattr(stub, rpc), request_, timeout=WAIT)
    assert error.code() == code
    assert message in error.details()


def test_get_unknown_model_is_not_found(served):
    stub, _, _ = served
    error = status_of(stub.GetModel, pb.GetModelRequest(name="nope"), timeout=WAIT)
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert error.details() == "unknown model 'nope'; available: fake-translate"


@pytest.mark.parametrize(
    "exc, code",
    [
        (ValueError("source is too long"), grpc.StatusCode.INVALID_ARGUMENT),
        (generation.InputTooLargeError("audio is 31 s long"), grpc.StatusCode.OUT_OF_RANGE),
        (NotImplementedError("beam search"), grpc.StatusCode.UNIMPLEMENTED),
        (generation.OverloadedError("queue full"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (generation.UnavailableError("closing"), grpc.StatusCode.UNAVAILABLE),
        (TimeoutError("too slow"), grpc.StatusCode.DEADLINE_EXCEEDED),
        (RuntimeError("broken invariant"), grpc.StatusCode.INTERNAL),
        (KeyError("oops"), grpc.StatusCode.INTERNAL),
    ],
)
@pytest.mark.parametrize("rpc", ["Generate", "GenerateStream"])
def test_validation_exceptions_map_to_status_codes(served, rpc, exc, code):
    stub, _, engine = served
    engine.reject = exc
    error = status_of(getattr(stub, rpc), text_request(), timeout=WAIT)
    assert (error.code(), error.details()) == (code, str(exc))


@pytest.mark.parametrize(
    "exc, code",
    [
        # Raised after validation, on the worker: the server's fault, whatever the type says.
        (ValueError("shapes (2,3) and (4,) not aligned"), grpc.StatusCode.INTERNAL),
        (generation.InputTooLargeError("audio is 31 s long"), grpc.StatusCode.INTERNAL),
        (NotImplementedError("beam search"), grpc.StatusCode.INTERNAL),
        (TimeoutError("too slow"), grpc.StatusCode.INTERNAL),
        (RuntimeError("broken invariant"), grpc.StatusCode.INTERNAL),
        (KeyError("oops"), grpc.StatusCode.INTERNAL),
        # The engine shedding load or closing is not a fault.
        (generation.OverloadedError("queue full"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (generation.UnavailableError("closing"), grpc.StatusCode.UNAVAILABLE),
    ],
)
@pytest.mark.parametrize("rpc", ["Generate", "GenerateStream"])
def test_engine_exceptions_after_validation_map_to_status_codes(served, rpc, exc, code):
    stub, _, engine = served
    engine.fail = exc
    error = status_of(getattr(stub, rpc), text_request(), timeout=WAIT)
    assert error.code() == code and str(exc) in error.details()


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


def _leave_early(stub, rpc: str, how: str, request: pb.GenerateRequest, running: threading.Event):
    """Sends `request`, then leaves it while it runs: cancels once `running` is set, or lets a short
    deadline pass.

    Returns:
        The client's view of the call: an object with code() and details().
    """
    if how == "deadline":
        return status_of(getattr(stub, rpc), request, timeout=0.5)
    if rpc == "Generate":
        call = stub.Generate.future(request, timeout=WAIT)
    else:
        call = stub.GenerateStream(request, timeout=WAIT)
    assert running.wait(WAIT)
    call.cancel()
    return call


LEFT_WITH = {"cancel": grpc.StatusCode.CANCELLED, "deadline": grpc.StatusCode.DEADLINE_EXCEEDED}


@pytest.mark.parametrize("how", ["cancel", "deadline"])
@pytest.mark.parametrize("rpc", ["Generate", "GenerateStream"])
def test_leaving_cancels_the_running_request_in_the_engine(served, rpc, how):
    stub, _, engine = served
    engine.pause_after_first = True  # the request runs until the engine is told to cancel it
    left = _leave_early(stub, rpc, how, text_request("abcdef"), engine.paused)
    assert left.code() == LEFT_WITH[how]
    with pytest.raises(concurrent.futures.CancelledError):
        engine.futures[-1].result(WAIT)


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
    unknown = {"model": "", "code": "NOT_FOUND"}
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

TINY = "tiny-translate"


@pytest.fixture(scope="module")
def real_server(tiny_server):
    """(stub, engines) of the session's in-process server on the tiny model."""
    background, engines = tiny_server
    with grpc.insecure_channel(background.address) as channel:
        yield pb_grpc.AttnServeStub(channel), engines


@pytest.fixture
def held_server(tiny_model_repo):
    """A server on the tiny model whose second decoder call waits until the servicer cancels a request.

    Yields:
        stub, engine, runtime (its RecordingRuntime) and submitted (the engine's futures, in order).
    """
    engine, runtime = recording_engine(tiny_model_repo, TINY)
    released, submitted = threading.Event(), []
    submit, cancel = engine.submit, engine.cancel

    def submit_and_keep(*args):
        submitted.append(submit(*args))
        return submitted[-1]

    def cancel_and_release(future):
        cancel(future)
        released.set()

    engine.submit, engine.cancel = submit_and_keep, cancel_and_release
    runtime.hold[1] = released
    with app.BackgroundServer({TINY: engine}) as background, grpc.insecure_channel(background.address) as channel:
        yield types.SimpleNamespace(
            stub=pb_grpc.AttnServeStub(channel), engine=engine, runtime=runtime, submitted=submitted
        )


def _without_timings(response: pb.GenerateResponse) -> pb.GenerateResponse:
    response = type(response).FromString(response.SerializeToString())
    response.ClearField("timings")
    return response


def _tiny_request(**fields) -> pb.GenerateRequest:
    fields.setdefault("model", TINY)
    fields.setdefault("text", pb.TextInput(text="hello world"))
    return pb.GenerateRequest(**fields)


def _rows(matrix: pb.AttentionMatrix) -> np.ndarray:
    return np.reshape(matrix.weights, (matrix.rows, matrix.cols))


def test_real_served_equals_offline(real_server):
    stub, engines = real_server
    request = _tiny_request(target_language="en", attention=with_attention())
    served_ = stub.Generate(request, timeout=WAIT)
    offline = engines[request.model].submit(convert.request_from_proto(request)).result(timeout=WAIT)
    assert _without_timings(served_) == _without_timings(convert.result_to_proto(offline))


@pytest.mark.parametrize("granularity", [pb.ATTENTION_GRANULARITY_PIECES, pb.ATTENTION_GRANULARITY_WORDS])
@pytest.mark.parametrize("beam_size", [1, 3])
def test_real_stream_equals_unary(real_server, beam_size, granularity):
    stub, _ = real_server
    decoding = pb.DecodingOptions(beam_size=beam_size)
    request = _tiny_request(decoding=decoding, attention=with_attention(layer=0, granularity=granularity))
    unary = stub.Generate(request, timeout=WAIT)
    *events, final = list(stub.GenerateStream(request, timeout=WAIT))
    assert _without_timings(final.response) == _without_timings(unary)
    assert [e.token.index for e in events] == list(range(len(unary.tokens))) and events
    assert [e.token.token for e in events] == list(unary.tokens)
    # At either granularity a token streams its row of the piece-level matrix.
    request.attention.granularity = pb.ATTENTION_GRANULARITY_PIECES
    pieces = stub.Generate(request, timeout=WAIT).attention
    np.testing.assert_allclose([e.token.attention for e in events], _rows(pieces), atol=1e-6)


@pytest.mark.parametrize("interval", [2, 3, 256])
def test_real_stream_batched_by_stream_interval_carries_the_same_tokens_in_fewer_messages(real_server, interval):
    stub, _ = real_server
    decoding = pb.DecodingOptions(max_new_tokens=11, min_new_tokens=11)
    request = _tiny_request(decoding=decoding, attention=with_attention(layer=0))
    one_by_one = list(stub.GenerateStream(request, timeout=WAIT))
    request.stream_interval = interval
    *messages, final = list(stub.GenerateStream(request, timeout=WAIT))
    # The first token alone, then `interval` at a time, the last batch shorter.
    sizes = [1 if m.WhichOneof("event") == "token" else len(m.tokens.tokens) for m in messages]
    assert sizes == [1, *[min(interval, 10 - i) for i in range(0, 10, interval)]]
    assert [m.WhichOneof("event") for m in messages[1:]] == ["tokens" if n > 1 else "token" for n in sizes[1:]]
    batched = [e for m in messages for e in ([m.token] if m.WhichOneof("event") == "token" else m.tokens.tokens)]
    assert batched == [m.token for m in one_by_one[:-1]]
    assert _without_timings(final.response) == _without_timings(one_by_one[-1].response)


def test_a_stream_interval_past_its_limit_is_invalid_argument(real_server):
    stub, _ = real_server
    error = status_of(stub.GenerateStream, _tiny_request(stream_interval=257), timeout=WAIT)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "stream_interval 257 is out of range: use 0..256" in error.details()


def test_real_stream_has_no_rows_without_attention(real_server):
    stub, _ = real_server
    *events, final = list(stub.GenerateStream(_tiny_request(), timeout=WAIT))
    assert events and all(len(e.token.attention) == 0 for e in events)
    assert not final.response.HasField("attention")


@pytest.mark.parametrize("rpc, how", [("GenerateStream", "cancel"), ("Generate", "deadline")])
def test_real_request_left_early_stops_decoding(held_server, rpc, how):
    server = held_server
    left = _leave_early(server.stub, rpc, how, _tiny_request(), server.runtime.holding)
    assert left.code() == LEFT_WITH[how]
    with pytest.raises(concurrent.futures.CancelledError):
        server.submitted[0].result(WAIT)
    server.engine.close()  # waits for the batch to end: the future is answered before its last step
    # Of the model's 40 steps: the first, the held second (the cancel arrives while it waits, and is seen
    # when it ends), and a third in which the strategy drops the row.
    assert len(server.runtime.steps) == 3


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"text": pb.TextInput(text="")}, "empty"),
        ({"target_language": "fr"}, "fr"),
        ({"text": pb.TextInput(text="hello " * 2000)}, "long"),
        ({"decoding": pb.DecodingOptions(max_new_tokens=100000)}, "100000"),
        ({"decoding": pb.DecodingOptions(max_new_tokens=-1)}, "-1"),
        ({"text": None}, "missing input"),
        ({"attention": pb.AttentionOptions(mode=pb.ATTENTION_MODE_AGGREGATED, heads=[0, 9])},
         "attention heads [9] are out of range: model 'tiny-translate' has 4 heads per layer"),
    ],
)
def test_real_bad_inputs_are_invalid_argument(real_server, fields, message):
    stub, _ = real_server
    error = status_of(stub.Generate, _tiny_request(**fields), timeout=WAIT)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in error.details()


def test_a_real_unknown_model_is_not_found(real_server):
    stub, _ = real_server
    error = status_of(stub.Generate, _tiny_request(model="nope"), timeout=WAIT)
    assert error.code() == grpc.StatusCode.NOT_FOUND and "nope" in error.details()


# ---- submitting off the event loop, binding ------------------------------------------------------------


class SlowSubmitEngine(FakeEngine):
    """A fake whose `submit` blocks until `release` is set, as validating megabytes of text does."""

    def __init__(self):
        super().__init__("slow-submit")
        self.submitting, self.release = threading.Event(), threading.Event()
        self.submitted: list[concurrent.futures.Future] = []
        self.cancelled: list[concurrent.futures.Future] = []

    def submit(self, request, on_token=None) -> concurrent.futures.Future:
        self.submitting.set()
        assert self.release.wait(WAIT), "submit was never released"
        self.submitted.append(super().submit(request, on_token))
        return self.submitted[-1]

    def cancel(self, future: concurrent.futures.Future) -> None:
        self.cancelled.append(future)
        super().cancel(future)


@pytest.fixture
def slow_submit():
    """(stub, channel, engine) of a server whose one model is a SlowSubmitEngine."""
    engine = SlowSubmitEngine()
    with app.BackgroundServer({engine.info.name: engine}) as background:
        with grpc.insecure_channel(background.address) as channel:
            try:
                yield pb_grpc.AttnServeStub(channel), channel, engine
            finally:
                engine.release.set()  # before the server stops, so that no submitting thread is left waiting


@pytest.mark.parametrize("rpc", ["Generate", "GenerateStream"])
def test_a_slow_submit_does_not_stall_other_calls(slow_submit, rpc):
    stub, channel, engine = slow_submit
    request = text_request("abc", model="slow-submit")
    if rpc == "Generate":
        call = stub.Generate.future(request, timeout=WAIT)
    else:
        call = stub.GenerateStream(request, timeout=WAIT)
    assert engine.submitting.wait(WAIT)
    # While the request is being submitted, the event loop still answers everyone else.
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert [m.name for m in stub.ListModels(pb.ListModelsRequest(), timeout=5).models] == ["slow-submit"]
    engine.release.set()
    final = call.result() if rpc == "Generate" else list(call)[-1].response
    assert final.text == "cba"


def test_a_request_left_while_it_is_submitted_is_cancelled_once_queued(slow_submit):
    stub, _, engine = slow_submit
    engine.gate.clear()  # the request would otherwise finish before anyone could cancel it
    left = _sample("attnserve_requests_total", model="slow-submit", code="CANCELLED")
    call = stub.Generate.future(text_request("abc", model="slow-submit"), timeout=WAIT)
    assert engine.submitting.wait(WAIT)
    call.cancel()
    wait_until(lambda: _sample("attnserve_requests_total", model="slow-submit", code="CANCELLED") > left)
    engine.release.set()  # the handler is gone; the request it submitted must not run unattended
    wait_until(lambda: engine.submitted and engine.submitted[-1] in engine.cancelled)
    engine.gate.set()
    with pytest.raises(concurrent.futures.CancelledError):
        engine.submitted[-1].result(WAIT)


def test_a_port_in_use_is_refused():
    engine = FakeEngine()
    with app.BackgroundServer({engine.info.name: engine}) as first:
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{first.server.port}"):
            app.BackgroundServer({engine.info.name: engine}, port=first.server.port)


@pytest.mark.parametrize(
    "field,flag,port", [("port", "--port", 70000), ("port", "--port", -1), ("metrics_port", "--metrics-port", 65536)]
)
def test_ports_out_of_range_are_refused_naming_the_flag(field, flag, port):
    with pytest.raises(ValueError, match=f"{flag} {port} is out of range"):
        app.ServeOptions(**{field: port})


def test_a_metrics_port_in_use_is_named():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            metrics.serve_http(port, address="127.0.0.1")


@pytest.mark.parametrize(
    "mangle", [lambda raw: raw.replace(b"hello", b"\xff\xfehllo"), lambda raw: raw[:-1]], ids=["bad-utf8", "truncated"]
)
@pytest.mark.parametrize("rpc", ["Generate", "GenerateStream"])
def test_requests_that_do_not_parse_are_invalid_argument(served, rpc, mangle):
    _, channel, _ = served
    raw = mangle(text_request("hello").SerializeToString())
    method = f"/attnserve.v1.AttnServe/{rpc}"
    call = channel.unary_unary(method) if rpc == "Generate" else channel.unary_stream(method)
    error = status_of(call, raw, timeout=WAIT)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("the request cannot be parsed: Error parsing message")


@pytest.mark.parametrize("remaining, counted_as_deadline", [(None, False), (0.05, False), (0.01, True), (-0.2, True)])
def test_a_cancel_counts_as_the_deadline_only_within_the_transit_jitter_of_it(remaining, counted_as_deadline):
    from attnserve.server.edge import service

    context = types.SimpleNamespace(time_remaining=lambda: remaining)
    assert service._deadline_passed(context) is counted_as_deadline  # 50 ms before it: the caller's cancel
