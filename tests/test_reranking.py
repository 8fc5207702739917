"""Reranking by translating back (server/engine/reranking.py) and the forced decoding it is built on, on the tiny
model of conftest.py: a forced output's log-probabilities are PyTorch's teacher-forced ones and a beam
candidate's own score; the reranked order is the documented sum; the winner's attention is its own; bad
options and streaming are refused; cancelling ends every round; the option crosses the wire."""

from __future__ import annotations

import dataclasses
import threading

import grpc
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnserve.export.translation import bpe
from attnserve.api import convert
from attnserve.server.edge import app
from attnserve.server.edge.engine_process import load_process_engines
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.registry import load_engine
from attnserve.api.generation import AttentionOptions, DecodingOptions, GenerationRequest, GenerationResult
from attnserve.server.inputs.preprocessing import TextSource
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions
from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from conftest import TINY_MODEL_NAME
from fakes import WAIT

TEXT, TO = "Open the File menu", "zh-TW"


@pytest.fixture(scope="module")
def engine(tiny_model_repo):
    engine = load_engine(find_models(tiny_model_repo)[TINY_MODEL_NAME])
    yield engine
    engine.close()


def forced(engine, source_ids, language: str, output_ids, attention: bool = False) -> GenerationResult:
    """The engine's forced decoding of `output_ids` (EOS appended) after `source_ids` (EOS included)."""
    prepared = engine.prepare(GenerationRequest(TINY_MODEL_NAME, TEXT, language, DecodingOptions(beam_size=1),
                                                AttentionOptions(enabled=attention)))
    eos = engine.manifest.special_tokens.eos
    prepared = dataclasses.replace(prepared, source=TextSource(tuple(source_ids)), forced_ids=(*output_ids, eos),
                                   max_new_tokens=len(output_ids) + 1)
    return engine.submit_prepared(prepared).result(WAIT)


def summed(result: GenerationResult) -> float:
    """A forced result's log-probability of its whole output, EOS included."""
    return result.nbest[0].score * (len(result.tokens) + 1)


def source_ids(engine, text: str) -> tuple[int, ...]:
    return tuple(engine.prepare(GenerationRequest(TINY_MODEL_NAME, text, TO)).source.ids)


def test_a_forced_output_has_the_log_probabilities_pytorch_gives(engine, tiny_torch_model, tiny_tokenizer):
    torch.set_num_threads(1)
    src = source_ids(engine, TEXT)
    output = tiny_tokenizer.encode("選單 檔案 Open").ids  # any sequence, not what the model would choose
    result = forced(engine, src, TO, output)
    assert [t.id for t in result.tokens] == output
    start = bpe.language_token_ids(tiny_tokenizer)[TO]
    tgt = torch.tensor([[start, *output, bpe.EOS_ID]])
    src_t = torch.tensor([src])
    with torch.no_grad():
        logits = tiny_torch_model(src_t, torch.ones_like(src_t), tgt[:, :-1], torch.ones_like(tgt[:, :-1]))
    expected = F.log_softmax(logits.float(), -1)[0].gather(-1, tgt[0, 1:, None])[:, 0].numpy()
    np.testing.assert_allclose([t.logprob for t in result.tokens], expected[:-1], atol=1e-4)
    assert summed(result) == pytest.approx(float(expected.sum()), abs=1e-3)


def test_forcing_each_beam_candidate_gives_back_its_beam_score(engine):
    beam = engine.generate(GenerationRequest(TINY_MODEL_NAME, TEXT, TO, DecodingOptions(
        beam_size=4, num_return_sequences=4, max_new_tokens=12)), WAIT)
    assert len(beam.nbest) >= 2
    src = source_ids(engine, TEXT)
    for candidate in beam.nbest:
        if candidate.finish_reason.value != "eos":
            continue  # a candidate cut at the length limit has no EOS to force
        again = forced(engine, src, TO, [t.id for t in candidate.tokens])
        assert again.nbest[0].score == pytest.approx(candidate.score, abs=1e-5)
        np.testing.assert_allclose([t.logprob for t in again.tokens], [t.logprob for t in candidate.tokens],
                                   atol=1e-5)


# (text, target, weight, whether the winner differs from the beam's best on the tiny model)
CASES = [
    (TEXT, TO, 0.1, False),
    ("知識就是力量。", "en", 0.1, True),
    ("Writing programs in Python is fun", TO, 1.0, True),
]


@pytest.mark.parametrize("attention", [True, False])
@pytest.mark.parametrize("text, to, weight, changes", CASES)
def test_reranked_order_is_the_score_plus_the_weighted_back_translation(engine, text, to, weight, changes,
                                                                        attention):
    options = dict(beam_size=4, max_new_tokens=12)
    beam = engine.generate(GenerationRequest(TINY_MODEL_NAME, text, to, DecodingOptions(
        num_return_sequences=4, **options), AttentionOptions(enabled=True)), WAIT)
    reranked = engine.generate(GenerationRequest(TINY_MODEL_NAME, text, to, DecodingOptions(
        num_return_sequences=4, reverse_weight=weight, **options), AttentionOptions(enabled=attention)), WAIT)
    src, eos = source_ids(engine, text), engine.manifest.special_tokens.eos
    back = "en" if to == "zh-TW" else "zh-TW"
    # Each candidate translated back, forced to give the source (whose ids end with EOS).
    expected = sorted(
        ((c.score + weight * summed(forced(engine, (*[t.id for t in c.tokens], eos), back, src[:-1])), c.text)
         for c in beam.nbest),
        key=lambda pair: -pair[0],
    )
    assert [s.text for s in reranked.nbest] == [text for _, text in expected]
    np.testing.assert_allclose([s.score for s in reranked.nbest], [score for score, _ in expected], atol=1e-4)
    winner = reranked.nbest[0]
    assert (winner.text != beam.text) == changes
    assert reranked.text == winner.text and [t.id for t in reranked.tokens] == [t.id for t in winner.tokens]
    assert reranked.finish_reason == winner.finish_reason
    np.testing.assert_allclose([t.logprob for t in reranked.tokens], [t.logprob for t in winner.tokens], atol=1e-5)
    if not attention:
        assert reranked.attention is None
        return
    # Its attention is its own, whichever candidate won: the beam's when it won there, else that of the
    # winner decoded alone.
    own = beam if not changes else forced(engine, src, to, [t.id for t in winner.tokens], attention=True)
    assert len(reranked.attention.weights) == len(reranked.tokens)
    np.testing.assert_allclose(reranked.attention.weights, own.attention.weights, atol=1e-5)


def test_without_a_weight_the_beam_order_stands(engine):
    options = dict(beam_size=4, max_new_tokens=12, num_return_sequences=4)
    text, to = CASES[1][:2]
    plain = engine.generate(GenerationRequest(TINY_MODEL_NAME, text, to, DecodingOptions(**options)), WAIT)
    zero = engine.generate(GenerationRequest(TINY_MODEL_NAME, text, to, DecodingOptions(reverse_weight=0.0,
                                                                                         **options)), WAIT)
    assert [s.text for s in zero.nbest] == [s.text for s in plain.nbest]


@pytest.mark.parametrize("options, message", [
    (DecodingOptions(beam_size=1, reverse_weight=0.1), "beam_size 2 or more"),
    (DecodingOptions(beam_size=4, reverse_weight=-1.0), "reverse_weight -1.0 is out of range"),
    (DecodingOptions(beam_size=4, reverse_weight=float("nan")), "out of range"),
])
def test_bad_reverse_weights_are_refused(engine, options, message):
    with pytest.raises(ValueError, match=message):
        engine.submit(GenerationRequest(TINY_MODEL_NAME, TEXT, TO, options))


def test_a_reranked_request_cannot_be_streamed(engine):
    with pytest.raises(ValueError, match="cannot be streamed"):
        engine.submit(GenerationRequest(TINY_MODEL_NAME, TEXT, TO, DecodingOptions(beam_size=4, reverse_weight=0.1)),
                      on_token=lambda token: None)


def test_cancelling_a_reranked_request_ends_it_and_the_engine_goes_on(engine):
    started = threading.Event()
    request = GenerationRequest(TINY_MODEL_NAME, TEXT, TO, DecodingOptions(beam_size=4, reverse_weight=0.1))
    future = engine.submit_prepared(engine.prepare(request), on_start=started.set)
    engine.cancel(future)
    assert future.cancelled()
    assert engine.generate(request, WAIT).text  # later requests are served as before


def test_the_weight_crosses_the_wire():
    request = GenerationRequest("m", "x", "en", DecodingOptions(beam_size=4, reverse_weight=0.25))
    assert convert.request_from_proto(convert.request_to_proto(request)).decoding.reverse_weight == 0.25


@pytest.mark.parametrize("engine_process", [False, True], ids=["one process", "engine process"])
def test_served_reranking_equals_offline_and_is_never_streamed(tiny_model_repo, engine, engine_process):
    text, to, weight, _ = CASES[1]
    options = dict(beam_size=4, num_return_sequences=4, max_new_tokens=12, reverse_weight=weight)
    offline = engine.generate(GenerationRequest(TINY_MODEL_NAME, text, to, DecodingOptions(**options)), WAIT)
    # The server closes its engines when it stops: it gets its own.
    if engine_process:
        engines = load_process_engines(tiny_model_repo, RuntimeOptions(), BatchingOptions())
    else:
        engines = {TINY_MODEL_NAME: load_engine(find_models(tiny_model_repo)[TINY_MODEL_NAME])}
    with app.BackgroundServer(engines) as background, grpc.insecure_channel(background.address) as channel:
        stub = pb_grpc.AttnServeStub(channel)
        message = pb.GenerateRequest(model=TINY_MODEL_NAME, text=pb.TextInput(text=text), target_language=to,
                                     decoding=pb.DecodingOptions(**options))
        served = stub.Generate(message, timeout=WAIT)
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.GenerateStream(message, timeout=WAIT))
    assert served.text == offline.text
    assert [s.text for s in served.nbest] == [s.text for s in offline.nbest]
    assert [s.score for s in served.nbest] == pytest.approx([s.score for s in offline.nbest], abs=1e-5)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "cannot be streamed" in refused.value.details()
