"""Deadline-aware admission (server/engine/cost.py): the estimate follows what the model was seen to do, what
cannot finish before its deadline is refused at once with a retry hint, and the rest is admitted."""

from __future__ import annotations

import dataclasses

import grpc
import pytest
from prometheus_client import REGISTRY

from attnserve.server.edge import app
from attnserve.server.engine.cost import CostModel
from attnserve.api.generation import (
    DecodingOptions,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    OverloadedError,
    Timings,
    Token,
)
from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from fakes import WAIT, FakeEngine


def _result(tokens: int, decode_seconds: float) -> GenerationResult:
    timings = Timings(0.0, 0.0, 0.0, decode_seconds, decode_seconds, 1)
    return GenerationResult("m", "x" * tokens, "en", [Token("x", 1, 0.0)] * tokens, [], FinishReason.EOS, None,
                            timings)


@pytest.fixture
def costs() -> CostModel:
    """A model seen to answer 9 characters with 9 tokens in 1 s (10 steps: 0.1 s each), 4 rows at once."""
    model = CostModel(dataclasses.replace(FakeEngine().info, max_new_tokens=64), max_rows=4)
    _observe(model, GenerationRequest("m", "x" * 9), _result(9, 1.0))
    return model


def _observe(model: CostModel, request: GenerationRequest, result: GenerationResult) -> None:
    """The service's sequence: admitted, answered (observed), finished."""
    ticket = model.admit(request, None)
    model.observe(request, result, ticket)
    model.finished(ticket)


def test_nothing_is_refused_before_the_model_was_seen_or_without_a_deadline():
    model = CostModel(FakeEngine().info, max_rows=4)
    assert model.estimate(GenerationRequest("m", "x" * 1000)) is None
    assert model.admit(GenerationRequest("m", "x" * 1000), remaining=0.001).rows == 1


def test_the_estimate_scales_with_the_input_the_rows_sharing_and_the_rows_ahead(costs):
    long = GenerationRequest("m", "x" * 20, decoding=DecodingOptions(max_new_tokens=30))
    estimate = costs.estimate(long)
    assert estimate.wait_seconds == 0 and estimate.own_seconds == pytest.approx(2.1)  # 21 steps x 0.1 s
    capped = GenerationRequest("m", "x" * 20, decoding=DecodingOptions(max_new_tokens=5))
    assert costs.estimate(capped).own_seconds == pytest.approx(0.5)  # max_new_tokens bounds the steps
    beams = GenerationRequest("m", "x", decoding=DecodingOptions(beam_size=2))
    held = [costs.admit(beams, None), costs.admit(beams, None)]  # every row taken
    crowded = costs.estimate(GenerationRequest("m", "x"))
    assert crowded.wait_seconds == pytest.approx(0.25)  # 1 row over 4, x 1 s
    assert crowded.own_seconds == pytest.approx(2 * 4 * 0.1)  # 2 steps, each shared by the 4 rows it allows
    for ticket in held:
        costs.finished(ticket)
    assert costs.estimate(GenerationRequest("m", "x")).wait_seconds == 0


def test_what_cannot_finish_in_time_is_refused_with_a_retry_hint(costs):
    long = GenerationRequest("m", "x" * 20, decoding=DecodingOptions(max_new_tokens=30))
    assert costs.admit(long, remaining=1.0).rows == 1  # an idle model admits: it must go on learning
    with pytest.raises(OverloadedError, match=r"cannot answer within the deadline: .* 4\.2 s of decoding, 1\.0 s "
                                              r"left; retry in") as refused:
        costs.admit(long, remaining=1.0)  # 21 steps x 2 rows x 0.1 s
    assert refused.value.reason == "deadline" and refused.value.retry_after == 0.0
    costs.admit(long, remaining=6.0)  # 4.2 s of 6 x 0.8: admitted


def test_served_refusal_is_resource_exhausted_and_counted_under_deadline():
    engine = FakeEngine()
    labels = {"model": engine.info.name, "code": "RESOURCE_EXHAUSTED", "reason": "deadline"}
    before = REGISTRY.get_sample_value("attnserve_rejected_requests_total", labels) or 0.0
    with app.BackgroundServer({engine.info.name: engine}) as background, \
            grpc.insecure_channel(background.address) as channel:
        generate = pb_grpc.AttnServeStub(channel).Generate
        seen = pb.GenerateRequest(model=engine.info.name, text=pb.TextInput(text="hello"))
        assert generate(seen, timeout=WAIT).text == "olleh"
        # What the fake is seen to do, made slow: 10 s a step.
        (costs,) = background.server.costs.values()
        _observe(costs, GenerationRequest(engine.info.name, "hello"), _result(5, 60.0))
        costs.admit(GenerationRequest(engine.info.name, "busy"), None)  # not idle: estimates apply
        with pytest.raises(grpc.RpcError) as refused:
            generate(seen, timeout=5)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "cannot answer within the deadline" in refused.value.details()
        assert generate(seen, timeout=WAIT * 10).text == "olleh"  # with time enough it is admitted
    assert REGISTRY.get_sample_value("attnserve_rejected_requests_total", labels) == before + 1



def test_step_time_is_a_fixed_part_plus_a_part_per_row_once_the_rows_vary():
    from attnserve.server.engine.cost import _StepFit

    fit = _StepFit()
    fit.add(8, 0.036)
    assert fit.seconds(16) == pytest.approx(0.072)  # one row count seen: proportional
    for rows in (1, 10, 20, 5, 30):
        fit.add(rows, 0.02 + 0.002 * rows)  # 20 ms per call (the weights), 2 ms per row
    assert fit.seconds(40) == pytest.approx(0.02 + 0.002 * 40, rel=0.1)  # not 40 x the mean per row
