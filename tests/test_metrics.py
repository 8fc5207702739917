"""What the server exports to Prometheus: load gauges, token counters, rejections, deadlines, model info."""

from __future__ import annotations

import time

import grpc
import pytest
from prometheus_client import REGISTRY

from attnserve.api import generation
from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from conftest import TINY_MODEL_NAME
from fakes import WAIT, held

FAKE = "fake-translate"


@pytest.fixture
def stub(fake_server, fake_engine):
    background, _ = fake_server
    with grpc.insecure_channel(background.address) as channel:
        yield pb_grpc.AttnServeStub(channel)


def sample(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def request(text: str = "hello", model: str = FAKE, **fields) -> pb.GenerateRequest:
    return pb.GenerateRequest(model=model, text=pb.TextInput(text=text), **fields)


def wait_until(predicate) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def load() -> dict[str, float]:
    names = ("queue_depth", "running_requests", "running_rows", "requests_in_flight")
    return {name: sample(f"attnserve_{name}", model=FAKE) for name in names}


def test_load_gauges_follow_queued_and_running_requests(stub, fake_engine):
    fake_engine.gate.clear()  # the fake's one worker holds the first request; the others queue behind it
    beams = pb.DecodingOptions(beam_size=3)
    calls = [stub.Generate.future(request("first", decoding=beams), timeout=WAIT)]
    wait_until(lambda: fake_engine.futures and fake_engine.futures[-1].running())
    calls += [stub.Generate.future(request(text), timeout=WAIT) for text in ("second", "third")]
    wait_until(lambda: load()["queue_depth"] == 2)
    assert load() == {"queue_depth": 2, "running_requests": 1, "running_rows": 3, "requests_in_flight": 3}

    fake_engine.gate.set()
    assert [call.result(timeout=WAIT).text for call in calls] == ["tsrif", "dnoces", "driht"]
    wait_until(lambda: load()["requests_in_flight"] == 0)
    assert load() == dict.fromkeys(load(), 0)  # idle models read 0 rather than vanishing


def test_a_passed_deadline_is_counted_as_deadline_exceeded_not_cancelled(stub, fake_engine, monkeypatch):
    codes = ("DEADLINE_EXCEEDED", "CANCELLED")
    before = [sample("attnserve_requests_total", model=FAKE, code=code) for code in codes]
    fake_engine.gate.clear()
    held = stub.Generate.future(request("held"), timeout=WAIT)
    wait_until(lambda: fake_engine.futures and fake_engine.futures[-1].running())
    # The deadline passes while a request waits in the queue (the handler's own timer ends it), and while
    # its input is still being preprocessed (gRPC cancels the handler: this one used to count as CANCELLED).
    failures = [_late(stub, streamed=False), _late(stub, streamed=True)]
    submit = fake_engine.submit
    monkeypatch.setattr(fake_engine, "submit", lambda *args: time.sleep(1.5) or submit(*args))
    failures += [_late(stub, streamed=False), _late(stub, streamed=True)]
    fake_engine.gate.set()
    held.result(timeout=WAIT)
    assert failures == [grpc.StatusCode.DEADLINE_EXCEEDED] * 4
    wait_until(lambda: sample("attnserve_requests_total", model=FAKE, code="DEADLINE_EXCEEDED") >= before[0] + 4)
    after = [sample("attnserve_requests_total", model=FAKE, code=code) for code in codes]
    assert [a - b for a, b in zip(after, before)] == [4, 0]


def _late(stub, streamed: bool) -> grpc.StatusCode:
    """The status of a call whose deadline passes before the server answers."""
    with pytest.raises(grpc.RpcError) as raised:
        if streamed:
            list(stub.GenerateStream(request("late"), timeout=0.5))
        else:
            stub.Generate(request("late"), timeout=0.5)
    return raised.value.code()


@pytest.mark.parametrize(
    "failure,code,reason",
    [
        (generation.OverloadedError("the queue is full"), "RESOURCE_EXHAUSTED", "queue_full"),
        (generation.OverloadedError("no time", reason="deadline"), "RESOURCE_EXHAUSTED", "deadline"),
        (generation.InputTooLargeError("too long"), "OUT_OF_RANGE", "too_large"),
        (ValueError("bad input"), "INVALID_ARGUMENT", "invalid"),
    ],
)
def test_refused_requests_are_counted_by_code_and_reason(stub, fake_engine, failure, code, reason):
    fake_engine.reject = failure  # refused at submit, as validation and a full queue refuse
    before = sample("attnserve_rejected_requests_total", model=FAKE, code=code, reason=reason)
    with pytest.raises(grpc.RpcError):
        stub.Generate(request(), timeout=WAIT)
    assert sample("attnserve_rejected_requests_total", model=FAKE, code=code, reason=reason) == before + 1


def test_answered_requests_count_their_tokens(stub):
    input_before = sample("attnserve_input_tokens_total", model=FAKE)
    output_before = sample("attnserve_output_tokens_total", model=FAKE)
    result = stub.Generate(request("abcd"), timeout=WAIT)
    assert sample("attnserve_input_tokens_total", model=FAKE) == input_before + len(result.source_tokens)
    assert sample("attnserve_output_tokens_total", model=FAKE) == output_before + len(result.tokens)


def test_a_real_model_reports_its_provider_and_model_call_times(tiny_server):
    background, _ = tiny_server
    assert sample("attnserve_model_info", model=TINY_MODEL_NAME, version="1", provider="CPUExecutionProvider") == 1
    encodes = sample("attnserve_encode_duration_seconds_count", model=TINY_MODEL_NAME)
    steps = sample("attnserve_decode_step_duration_seconds_count", model=TINY_MODEL_NAME)
    with grpc.insecure_channel(background.address) as channel:
        pb_grpc.AttnServeStub(channel).Generate(
            request("Knowledge is power.", model=TINY_MODEL_NAME, decoding=pb.DecodingOptions(max_new_tokens=3)),
            timeout=WAIT,
        )
    assert sample("attnserve_encode_duration_seconds_count", model=TINY_MODEL_NAME) == encodes + 1
    assert sample("attnserve_decode_step_duration_seconds_count", model=TINY_MODEL_NAME) == steps + 1
    assert sample("attnserve_decode_step_duration_seconds_sum", model=TINY_MODEL_NAME) > 0


def test_a_real_model_records_what_its_responses_report(tiny_server):
    # Two requests queued behind a held worker start together: under continuous batching (the server's
    # default) they share every decoder call, and each histogram gets the timings its response carries.
    background, engines = tiny_server
    engine = engines[TINY_MODEL_NAME]
    names = ("batch_size", "queue_duration_seconds", "time_to_first_token_seconds", "request_duration_seconds")
    before = {name: [sample(f"attnserve_{name}_{s}", model=TINY_MODEL_NAME) for s in ("sum", "count")]
              for name in names}
    decoding = pb.DecodingOptions(max_new_tokens=3, min_new_tokens=3)
    with grpc.insecure_channel(background.address) as channel:
        generate = pb_grpc.AttnServeStub(channel).Generate
        with held(engine, generation.GenerationRequest(TINY_MODEL_NAME, "Save")):
            calls = [generate.future(request(t, model=TINY_MODEL_NAME, decoding=decoding), timeout=WAIT)
                     for t in ("Knowledge is power.", "知識就是力量。")]
            wait_until(lambda: engine.queued() == 2)
        timings = [call.result().timings for call in calls]
    assert [t.batch_size for t in timings] == [2, 2]
    assert all(0 < t.queue_seconds <= t.first_token_seconds <= t.total_seconds for t in timings)
    reported = {
        "batch_size": [t.batch_size for t in timings],
        "queue_duration_seconds": [t.queue_seconds for t in timings],
        "time_to_first_token_seconds": [t.first_token_seconds for t in timings],
        "request_duration_seconds": [t.total_seconds for t in timings],
    }
    for name, values in reported.items():
        total, count = (sample(f"attnserve_{name}_{s}", model=TINY_MODEL_NAME) for s in ("sum", "count"))
        assert count == before[name][1] + 2
        assert total == pytest.approx(before[name][0] + sum(values), abs=1e-6)
