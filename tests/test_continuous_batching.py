"""Continuous batching (BatchingOptions.continuous): requests join a running batch at a step boundary.

The decisive comparison: a request admitted mid-flight gives what it gives alone (the windowed path, one
request per batch), on the Transformer (appended K/V cache) and on recurrent and speech models (replaced
state). Late arrivals are made late by the running request's own token callback, not by sleeping.
"""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError

import numpy as np
import pytest

from attnserve.server.batcher import BatchingOptions
from attnserve.server.engine import load_engine
from attnserve.server.generation import AttentionOptions, AudioInput, DecodingOptions, GenerationRequest
from attnserve.server.repository import find_models
from attnserve.server.runtime import RuntimeOptions
from attnserve.server.scheduler import SchedulingOptions
from conftest import TINY_MODEL_NAME, TINY_SPEECH_NAME
from fakes import MIXED_TEXTS, WAIT

CONTINUOUS = BatchingOptions(continuous=SchedulingOptions())
FAIR = 16
ALONE = BatchingOptions(max_batch_size=1, window_seconds=0.0)


def text(model: str, i: int, beam: int = 1, new: int = 20, at_least: int = 0) -> GenerationRequest:
    return GenerationRequest(
        model, MIXED_TEXTS[i], ["en", "zh-TW"][i % 2], DecodingOptions(new, beam, min_new_tokens=at_least),
        AttentionOptions(enabled=True),
    )


def speech(i: int, beam: int = 1, new: int = 8, at_least: int = 0) -> GenerationRequest:
    from test_speech import wav

    return GenerationRequest(TINY_SPEECH_NAME, audio=AudioInput(wav=wav(i)), attention=AttentionOptions(True),
                             decoding=DecodingOptions(new, beam, min_new_tokens=at_least))


def engines(repo, name, options=CONTINUOUS):
    model = find_models(repo)[name]
    return load_engine(model, RuntimeOptions(), options), load_engine(model, RuntimeOptions(), ALONE)


def assert_same(result, alone):
    assert [t.id for t in result.tokens] == [t.id for t in alone.tokens]
    np.testing.assert_allclose([t.logprob for t in result.tokens], [t.logprob for t in alone.tokens], atol=1e-5)
    np.testing.assert_allclose(result.attention.weights, alone.attention.weights, atol=1e-5)
    assert [s.text for s in result.nbest] == [s.text for s in alone.nbest]


def submit_after(engine, trigger, late, tokens: int):
    """Submits `trigger`, and `late` from its token callback once it has streamed `tokens` tokens."""
    arrived, late_futures, seen = threading.Event(), [], []

    def on_token(token):
        seen.append(token)
        if len(seen) == tokens:
            late_futures.extend(engine.submit(r) for r in late)
            arrived.set()

    first = engine.submit(trigger, on_token)
    assert arrived.wait(WAIT), "the running request never reached the step the late ones wait for"
    return first, late_futures


@pytest.fixture(scope="module")
def recurrent_repo(tmp_path_factory, tiny_tokenizer):
    from test_recurrent_state import NAME, Weights, write_model

    repo = tmp_path_factory.mktemp("continuous_lstm")
    write_model(repo / NAME / "1", Weights.random(tiny_tokenizer.get_vocab_size()), tiny_tokenizer)
    return repo, NAME


@pytest.fixture(params=["transformer", "recurrent", "speech"])
def model(request, tiny_model_repo, tiny_speech_repo, recurrent_repo):
    """(continuous engine, windowed one-at-a-time engine, request maker) of each architecture."""
    if request.param == "speech":
        pair, make = engines(tiny_speech_repo, TINY_SPEECH_NAME), speech
    else:
        repo, name = (tiny_model_repo, TINY_MODEL_NAME) if request.param == "transformer" else recurrent_repo
        pair = engines(repo, name)
        make = lambda i, **kw: text(name, i, **kw)  # noqa: E731
    yield (*pair, make)
    for engine in pair:
        engine.close()


@pytest.mark.parametrize("beam", [1, 3])
def test_a_request_admitted_mid_flight_equals_it_alone(model, beam):
    continuous, alone, make = model
    trigger = make(0, new=8, at_least=8)  # greedy, streams: its callback lets the late ones in
    late = [make(1, beam=beam), make(2, beam=beam), make(3)]
    first, futures = submit_after(continuous, trigger, late, tokens=3)
    results = [f.result(WAIT) for f in futures]
    assert_same(first.result(WAIT), alone.generate(trigger, WAIT))
    for request, result in zip(late, results):
        assert_same(result, alone.generate(request, WAIT))
    # They ran beside the trigger, which had 5 more tokens to go when they were submitted.
    assert max(r.timings.batch_size for r in results) >= 2


def test_greedy_and_beam_rows_of_different_ages_share_decoder_calls(tiny_model_repo):
    continuous, alone = engines(tiny_model_repo, TINY_MODEL_NAME)
    try:
        beam = text(TINY_MODEL_NAME, 4, beam=4, new=30, at_least=12)
        trigger = text(TINY_MODEL_NAME, 0, new=12, at_least=12)
        late = [text(TINY_MODEL_NAME, 5, beam=2), text(TINY_MODEL_NAME, 6)]
        beam_future = continuous.submit(beam)
        first, futures = submit_after(continuous, trigger, late, tokens=4)
        for request, future in zip([beam, trigger], [beam_future, first]):
            assert_same(future.result(WAIT), alone.generate(request, WAIT))
        for request, future in zip(late, futures):
            result = future.result(WAIT)
            assert_same(result, alone.generate(request, WAIT))
            assert result.timings.batch_size >= 3
    finally:
        continuous.close()
        alone.close()


def test_a_short_request_finishes_before_a_long_beam_search_that_started_earlier(tiny_model_repo):
    # Room for the beam-16 request and one more row: the short one gets in only if the beam yields.
    options = BatchingOptions(continuous=SchedulingOptions(max_rows=17, fair_share_row_steps=FAIR))
    continuous, alone = engines(tiny_model_repo, TINY_MODEL_NAME, options)
    finished = []
    try:
        long = text(TINY_MODEL_NAME, 2, beam=16, new=40, at_least=30)
        short = text(TINY_MODEL_NAME, 1, new=3)
        long_future = continuous.submit(long)
        long_future.add_done_callback(lambda _: finished.append("long"))
        # The trigger holds the other row past the beam's end, so only fairness lets the short one in early.
        trigger, (short_future,) = submit_after(continuous, text(TINY_MODEL_NAME, 0, new=40, at_least=40), [short], 2)
        short_future.add_done_callback(lambda _: finished.append("short"))
        assert_same(short_future.result(WAIT), alone.generate(short, WAIT))
        assert_same(long_future.result(WAIT), alone.generate(long, WAIT))
        trigger.result(WAIT)
    finally:
        continuous.close()
        alone.close()
    assert finished == ["short", "long"]


def test_cancelling_a_running_request_frees_its_row_within_one_step(tiny_model_repo):
    continuous, alone = engines(tiny_model_repo, TINY_MODEL_NAME)
    log, holder = [], {}
    other = text(TINY_MODEL_NAME, 3, new=20, at_least=20)

    def victim_token(token):
        if token.index == 0:  # the other request joins at the next step boundary
            holder["kept"] = continuous.submit(other, lambda token: log.append(continuous.running_rows()))
        if token.index == 4:
            continuous.cancel(holder["victim"])
            log.append("cancel")

    try:
        holder["victim"] = continuous.submit(text(TINY_MODEL_NAME, 0, new=30, at_least=30), victim_token)
        with pytest.raises(CancelledError):
            holder["victim"].result(WAIT)
        assert_same(holder["kept"].result(WAIT), alone.generate(other, WAIT))
    finally:
        continuous.close()
        alone.close()
    before, after = log[: log.index("cancel")], log[log.index("cancel") + 1:]
    assert before and set(before) == {2}  # they decoded together
    # The step the cancel happened in is the last one shared (after[0]); from the next one the row is gone.
    assert after[0] in (1, 2) and set(after[1:-1]) == {1}
    assert after[-1] == 0  # the kept request's own last step freed its row


def test_admission_bounds_rows_but_never_blocks_an_empty_lane():
    from attnserve.server.scheduler import Scheduler

    fits = Scheduler(SchedulingOptions(max_rows=8, max_admit=3)).admission()
    assert [fits(rows) for rows in (16, 1)] == [True, False]  # wider than the limit: alone, on an empty lane
    fits = Scheduler(SchedulingOptions(max_rows=8, max_admit=3)).admission()
    assert [fits(rows) for rows in (4, 4, 1)] == [True, True, False]  # full
    fits = Scheduler(SchedulingOptions(max_rows=64, max_admit=3)).admission()
    assert [fits(1) for _ in range(4)] == [True, True, True, False]  # at most max_admit per step


def test_served_over_grpc_streamed_equals_unary_equals_the_windowed_server(tiny_model_repo, tiny_server):
    from concurrent.futures import ThreadPoolExecutor

    from attnserve.clients.client import Client, translation_request
    from attnserve.server import app, serve_options

    parser = __import__("argparse").ArgumentParser()
    serve_options.add_arguments(parser)
    options = serve_options.from_args(parser.parse_args(["--models", str(tiny_model_repo), "--continuous-batching"]))
    assert options.continuous_batching
    requests = [translation_request(t, attention=True, granularity="pieces", model=TINY_MODEL_NAME,
                                    beam_size=1 + i % 3, max_new_tokens=12) for i, t in enumerate(MIXED_TEXTS)]
    windowed, _ = tiny_server
    engines = app.load_engines(options)
    try:
        with app.BackgroundServer(engines) as background, Client(background.address) as client, \
                Client(windowed.address) as reference, ThreadPoolExecutor(8) as pool:
            unary = list(pool.map(client.generate, requests))
            streamed = list(pool.map(lambda r: list(client.stream(r)), requests))
            for request, result, events in zip(requests, unary, streamed):
                *tokens, final = events
                assert [t.token for t in tokens] == final.tokens  # one request: exactly what it streamed
                # Different runs share decoder calls with different neighbours: equal up to float rounding.
                for other in (final, reference.generate(request)):
                    assert [t.id for t in result.tokens] == [t.id for t in other.tokens]
                    np.testing.assert_allclose([t.logprob for t in result.tokens],
                                               [t.logprob for t in other.tokens], atol=1e-5)
                    np.testing.assert_allclose(result.attention.weights, other.attention.weights, atol=1e-5)
    finally:
        for engine in engines.values():
            engine.close()


def test_a_request_failing_mid_flight_fails_alone(tiny_model_repo, monkeypatch):
    continuous, alone = engines(tiny_model_repo, TINY_MODEL_NAME)
    encode = continuous.tokenizer.encode
    monkeypatch.setattr(continuous.tokenizer, "encode", lambda s: [10**6] if s == "BAD" else encode(s))
    trigger = text(TINY_MODEL_NAME, 0, new=10, at_least=10)
    good = [text(TINY_MODEL_NAME, 1), text(TINY_MODEL_NAME, 2)]
    bad = GenerationRequest(TINY_MODEL_NAME, "BAD", decoding=DecodingOptions(3))
    try:
        # The newcomers' encoder call fails: they are retried one by one, the running request goes on.
        first, (bad_future, *futures) = submit_after(continuous, trigger, [bad, *good], tokens=2)
        with pytest.raises(Exception, match="Gather"):
            bad_future.result(WAIT)
        for request, future in zip([trigger, *good], [first, *futures]):
            assert_same(future.result(WAIT), alone.generate(request, WAIT))
    finally:
        continuous.close()
        alone.close()


def test_a_failed_step_retries_its_requests_alone(tiny_model_repo, monkeypatch):
    continuous, alone = engines(tiny_model_repo, TINY_MODEL_NAME)
    step, failed = continuous.runtime.decode_step, []

    def flaky(feeds):
        if not failed and len(next(iter(feeds.values()))) > 1:  # once, on the first shared step
            failed.append(True)
            raise RuntimeError("injected")
        return step(feeds)

    monkeypatch.setattr(continuous.runtime, "decode_step", flaky)
    trigger, late = text(TINY_MODEL_NAME, 0, new=10, at_least=10), [text(TINY_MODEL_NAME, 1, beam=2)]
    try:
        first, futures = submit_after(continuous, trigger, late, tokens=2)
        for request, future in zip([trigger, *late], [first, *futures]):
            assert_same(future.result(WAIT), alone.generate(request, WAIT))
    finally:
        continuous.close()
        alone.close()
    assert failed
