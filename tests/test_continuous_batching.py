"""Continuous batching (BatchingOptions.continuous, the default): requests join a running batch at a step
boundary.

The decisive comparison: a request admitted mid-flight gives what it gives alone (the windowed path, one
request per batch), on the Transformer (appended K/V cache) and on the recurrent translator, the speech
recognizer and the image captioner (replaced state; the speller's along the source axis too), with greedy,
beam and sampled search, streamed or not, next to a request that is cancelled or whose deadline passes;
with the decoder fed host arrays and with IO binding (the decoder state kept in device copies). Late arrivals
are made late by the running request's own token callback, not by sleeping.
"""

from __future__ import annotations

import dataclasses

import threading
from concurrent.futures import CancelledError

import numpy as np
import pytest

from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.registry import load_engine
from attnserve.api.generation import (
    AttentionOptions,
    AudioInput,
    DecodingOptions,
    GenerationRequest,
    ImageInput,
    SamplingOptions,
)
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions
from attnserve.server.engine.scheduler import SchedulingOptions
from conftest import TINY_MODEL_NAME, TINY_SPEECH_NAME
from fakes import MIXED_TEXTS, WAIT, recording_engine

CONTINUOUS = BatchingOptions()  # the default
FAIR = 16
ALONE = BatchingOptions(max_batch_size=1, window_ms=0.0, continuous=None)
# Newcomers encoded on the worker between steps: they join at the next step, whatever the encoder's speed.
INLINE_ENCODING = BatchingOptions(continuous=SchedulingOptions(overlap_encoding=False))
IMAGE_MAX_NEW = 6  # the tiny captioner's limit


def decoding(new: int, beam: int, at_least: int, seed: int | None) -> DecodingOptions:
    sampling = None if seed is None else SamplingOptions(temperature=1.5, top_k=20, seed=seed)
    return DecodingOptions(new, beam, min_new_tokens=at_least, sampling=sampling)


def text(model: str, i: int, beam: int = 1, new: int = 20, at_least: int = 0, seed=None) -> GenerationRequest:
    return GenerationRequest(
        model, MIXED_TEXTS[i], ["en", "zh-TW"][i % 2], decoding(new, beam, at_least, seed),
        AttentionOptions(enabled=True),
    )


def speech(i: int, beam: int = 1, new: int = 8, at_least: int = 0, seed=None) -> GenerationRequest:
    from test_speech import wav

    return GenerationRequest(TINY_SPEECH_NAME, audio=AudioInput(wav=wav(i)), attention=AttentionOptions(True),
                             decoding=decoding(new, beam, at_least, seed))


def image(i: int, beam: int = 1, new: int = 8, at_least: int = 0, seed=None) -> GenerationRequest:
    from test_image import image_file
    from tiny_image import NAME

    new = min(new, IMAGE_MAX_NEW)
    return GenerationRequest(NAME, image=ImageInput(image_file(i)), attention=AttentionOptions(True),
                             decoding=decoding(new, beam, min(at_least, new), seed))


def engines(repo, name, options=CONTINUOUS, runtime=RuntimeOptions()):
    """(engine batching with `options` on `runtime`, plain engine running one request at a time)."""
    model = find_models(repo)[name]
    return load_engine(model, runtime, options), load_engine(model, RuntimeOptions(), ALONE)


def assert_same(result, alone):
    assert [t.id for t in result.tokens] == [t.id for t in alone.tokens]
    np.testing.assert_allclose([t.logprob for t in result.tokens], [t.logprob for t in alone.tokens], atol=1e-5)
    np.testing.assert_allclose(result.attention.weights, alone.attention.weights, atol=1e-5)
    assert [s.text for s in result.nbest] == [s.text for s in alone.nbest]


def submit_after(engine, trigger, late, tokens: int, streams=None):
    """Submits `trigger`, and `late` from its token callback once it has streamed `tokens` tokens.

    Args:
        streams: None, or a list per late request that its streamed tokens are appended to.
    """
    arrived, late_futures, seen = threading.Event(), [], []
    callbacks = [None] * len(late) if streams is None else [stream.append for stream in streams]

    def on_token(token):
        seen.append(token)
        if len(seen) == tokens:
            late_futures.extend(engine.submit(r, on) for r, on in zip(late, callbacks))
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


@pytest.fixture(scope="module")
def image_repo(tmp_path_factory):
    from tiny_image import NAME, captioner, export_repo

    return export_repo(captioner(), tmp_path_factory.mktemp("continuous_image")), NAME


ARCHITECTURES = ["transformer", "recurrent", "speech", "image"]


def architecture(kind, repos, runtime=RuntimeOptions(), options=CONTINUOUS):
    """(engine batching with `options` on `runtime`, plain one-at-a-time engine, request maker) of one
    architecture.

    Args:
        repos: the tiny_model_repo, tiny_speech_repo, recurrent_repo and image_repo fixtures.
    """
    tiny_model_repo, tiny_speech_repo, recurrent_repo, image_repo = repos
    if kind == "speech":
        return (*engines(tiny_speech_repo, TINY_SPEECH_NAME, options, runtime), speech)
    if kind == "image":
        return (*engines(*image_repo, options, runtime), image)
    repo, name = (tiny_model_repo, TINY_MODEL_NAME) if kind == "transformer" else recurrent_repo
    return (*engines(repo, name, options, runtime), lambda i, **kw: text(name, i, **kw))


# How the continuous engine feeds its decoder: host arrays at every step, or IO binding (server/model/device_state.py,
# the CUDA default) keeping the encoder K/V and K/V cache in device copies, here on the CPU provider.
FEEDS = {"host feeds": RuntimeOptions(), "io binding": RuntimeOptions(io_binding=True)}


@pytest.fixture(params=[(kind, feeds) for kind in ARCHITECTURES for feeds in FEEDS],
                ids=lambda param: "-".join(param))
def model(request, tiny_model_repo, tiny_speech_repo, recurrent_repo, image_repo):
    """(continuous engine, plain one-at-a-time engine, request maker) of each architecture, fed both ways."""
    kind, feeds = request.param
    continuous, alone, make = architecture(kind, (tiny_model_repo, tiny_speech_repo, recurrent_repo, image_repo),
                                           FEEDS[feeds])
    yield continuous, alone, make
    continuous.close()
    alone.close()


# Search -> (beam size, sampling seeds) of the first two late requests; the third is always greedy.
SEARCHES = {"greedy": (1, (None, None)), "beam": (3, (None, None)), "sampled": (1, (7, 8))}


@pytest.mark.parametrize("search", SEARCHES)
def test_a_request_admitted_mid_flight_equals_it_alone(model, search):
    continuous, alone, make = model
    beam, seeds = SEARCHES[search]
    trigger = make(0, new=8, at_least=8)  # greedy, streams: its callback lets the late ones in
    late = [make(1, beam=beam, seed=seeds[0]), make(2, beam=beam, seed=seeds[1]), make(3)]
    streams = [[] for _ in late]
    first, futures = submit_after(continuous, trigger, late, tokens=3, streams=streams)
    results = [f.result(WAIT) for f in futures]
    assert_same(first.result(WAIT), alone.generate(trigger, WAIT))
    for request, result, stream in zip(late, results, streams):
        assert_same(result, alone.generate(request, WAIT))
        assert [event.token for event in stream] == result.tokens  # streamed == unary
        np.testing.assert_allclose([event.attention for event in stream], result.attention.weights, atol=1e-6)
    # They ran beside the trigger, which had more tokens to go when they were submitted.
    assert max(r.timings.batch_size for r in results) >= 2


def test_a_request_cancelled_mid_flight_leaves_its_neighbours_as_they_are_alone(model):
    continuous, alone, make = model
    trigger, other, holder = make(0, new=8, at_least=8), make(1), {}

    def admit(token):  # the trigger's callback, on the worker: the late requests join at the next step
        if token.index == 2:
            holder["victim"] = continuous.submit(make(2, new=8, at_least=8), cancel_self)
            holder["other"] = continuous.submit(other)

    def cancel_self(token):  # the victim cancels itself once it has run one step beside the others
        continuous.cancel(holder["victim"])

    first = continuous.submit(trigger, admit)
    assert_same(first.result(WAIT), alone.generate(trigger, WAIT))
    with pytest.raises(CancelledError):
        holder["victim"].result(WAIT)
    assert_same(holder["other"].result(WAIT), alone.generate(other, WAIT))


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


def running_rows(engine) -> int:
    """Batch rows decoding now (beams count one each): exact on the worker thread, as in a token callback."""
    scheduler = engine._continuous.scheduler
    return scheduler.rows if scheduler else 0


def test_cancelling_a_running_request_frees_its_row_within_one_step(tiny_model_repo):
    # Encoded between steps, the other request joins at the very next step (the claim needs them together).
    continuous, alone = engines(tiny_model_repo, TINY_MODEL_NAME, INLINE_ENCODING)
    log, holder = [], {}
    other = text(TINY_MODEL_NAME, 3, new=20, at_least=20)

    def victim_token(token):
        if token.index == 0:  # the other request joins at the next step boundary
            holder["kept"] = continuous.submit(other, lambda token: log.append(running_rows(continuous)))
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


@pytest.mark.parametrize("hold, company, joins_after", [(0, 0, 1), (3, 0, 4), (3, 2, 1)])
def test_a_held_request_joins_once_it_has_company_or_the_hold_ends(tiny_model_repo, hold, company, joins_after):
    """--admission-hold-steps: a request arriving alone mid-flight waits `hold` steps, one that arrives with
    enough others (here the hold queue is 3) joins at the next step; the result is the same either way."""
    options = dataclasses.replace(CONTINUOUS, continuous=SchedulingOptions(  # step counts exact: encode inline
        max_rows=16, admission_hold_steps=hold, admission_hold_queue=3, overlap_encoding=False))
    continuous, alone = engines(tiny_model_repo, TINY_MODEL_NAME, options)
    rows, late = [], [text(TINY_MODEL_NAME, 3 + k, new=6, at_least=6) for k in range(1 + company)]
    futures = []

    def first_token(token):
        rows.append(running_rows(continuous))
        if token.index == 0:
            futures.extend(continuous.submit(r) for r in late)

    try:
        long = continuous.submit(text(TINY_MODEL_NAME, 0, new=12, at_least=12), first_token)
        long.result(WAIT)
        for request, future in zip(late, futures):
            assert_same(future.result(WAIT), alone.generate(request, WAIT))
    finally:
        continuous.close()
        alone.close()
    # rows[i]: rows running in the step that made the long request's token i (after it was answered).
    assert rows[: joins_after] == [1] * joins_after and rows[joins_after] == 2 + company


def test_the_running_batch_keeps_stepping_while_newcomers_are_encoded(tiny_model_repo):
    """Requests admitted mid-flight are encoded on a second thread while the running rows keep decoding, and
    their rows count against --max-rows from admission on: with room for one newcomer, the second waits in the
    queue while the first is encoded. Everyone still gets what they would alone."""
    options = BatchingOptions(continuous=SchedulingOptions(max_rows=2))
    engine, runtime = recording_engine(tiny_model_repo, TINY_MODEL_NAME, options)
    alone = engines(tiny_model_repo, TINY_MODEL_NAME)[1]
    encoding, release, encoded, calls = threading.Event(), threading.Event(), threading.Event(), [0]
    encode = runtime.encode

    def slow_encode(feeds):  # the newcomer's encoder call (the second) waits to be released
        calls[0] += 1
        if calls[0] == 2:
            encoding.set()
            assert release.wait(WAIT)
        outputs = encode(feeds)
        if calls[0] >= 2:
            encoded.set()
        return outputs

    runtime.encode = slow_encode
    # The trigger submits the newcomers after decoder call 1; their encoding starts before call 2.
    held_step = threading.Event()
    runtime.hold[6] = held_step
    trigger = text(TINY_MODEL_NAME, 0, new=40, at_least=40)
    late = [text(TINY_MODEL_NAME, 3), text(TINY_MODEL_NAME, 5)]
    try:
        first, futures = submit_after(engine, trigger, late, tokens=2)
        assert encoding.wait(WAIT)
        assert runtime.holding.wait(WAIT), "the running batch stopped while a newcomer was encoded"
        assert not encoded.is_set()  # decoder calls 2-5 ran while the encoder call was still blocked
        assert engine.queued() == 1 and running_rows(engine) == 1  # the newcomer's row is reserved
        release.set()
        assert encoded.wait(WAIT)
        held_step.set()
        assert_same(first.result(WAIT), alone.generate(trigger, WAIT))
        results = [future.result(WAIT) for future in futures]
        for request, result in zip(late, results):
            assert_same(result, alone.generate(request, WAIT))
        assert results[0].timings.batch_size == 2  # it joined the trigger's batch mid-flight
    finally:
        release.set()
        held_step.set()
        engine.close()
        alone.close()


def test_admission_bounds_rows_but_never_blocks_an_empty_lane():
    from attnserve.server.engine.scheduler import Scheduler

    fits = Scheduler(SchedulingOptions(max_rows=8), max_admit=3).admission()
    assert [fits(rows) for rows in (16, 1)] == [True, False]  # wider than the limit: alone, on an empty lane
    fits = Scheduler(SchedulingOptions(max_rows=8), max_admit=3).admission()
    assert [fits(rows) for rows in (4, 4, 1)] == [True, True, False]  # full
    fits = Scheduler(SchedulingOptions(max_rows=64), max_admit=3).admission()
    assert [fits(1) for _ in range(4)] == [True, True, True, False]  # at most max_admit per step


def parse_serve_flags(*flags: str):
    from attnserve.server.edge import serve_options

    parser = __import__("argparse").ArgumentParser()
    serve_options.add_arguments(parser)
    return serve_options.from_args(parser.parse_args(list(flags)))


def test_serve_batches_continuously_unless_told_to_use_the_window():
    from attnserve.server.edge.serve_options import ServeOptions

    assert parse_serve_flags().batching == "continuous"
    assert parse_serve_flags("--batching", "window").batching == "window"
    assert parse_serve_flags("--continuous-batching").batching == "continuous"  # the earlier opt-in, still accepted
    with pytest.raises(SystemExit):
        parse_serve_flags("--batching", "static")
    with pytest.raises(ValueError, match="--batching 'static' is not one of continuous, window"):
        ServeOptions(batching="static")


def test_the_serve_flag_moves_encoding_onto_the_decode_thread(tiny_model_repo):
    from attnserve.server.edge import app

    assert parse_serve_flags().overlap_encoding and not parse_serve_flags("--inline-encoding").overlap_encoding
    options = app.ServeOptions(models=str(tiny_model_repo), overlap_encoding=False)
    engines, _ = app.load_models(options)
    try:
        assert not engines[TINY_MODEL_NAME]._batcher.options.continuous.overlap_encoding
    finally:
        for engine in engines.values():
            engine.close()


def test_served_over_grpc_streamed_equals_unary_equals_the_windowed_server(tiny_model_repo):
    from concurrent.futures import ThreadPoolExecutor

    from attnserve.clients.client import Client, translation_request
    from attnserve.server.edge import app

    requests = [translation_request(t, attention=True, granularity="pieces", model=TINY_MODEL_NAME,
                                    beam_size=1 + i % 3, max_new_tokens=12) for i, t in enumerate(MIXED_TEXTS)]
    engines = app.load_engines(parse_serve_flags("--models", str(tiny_model_repo)))
    windowed = app.load_engines(parse_serve_flags("--models", str(tiny_model_repo), "--batching", "window"))
    try:
        with app.BackgroundServer(engines) as background, app.BackgroundServer(windowed) as window, \
                Client(background.address) as client, Client(window.address) as reference, \
                ThreadPoolExecutor(8) as pool:
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
        for engine in [*engines.values(), *windowed.values()]:
            engine.close()


def test_a_deadline_passing_mid_flight_frees_the_row_and_spares_the_neighbour(tiny_model_repo):
    import grpc

    from attnserve.server.edge import app
    from attnserve.v1 import attnserve_pb2 as pb
    from attnserve.v1 import attnserve_pb2_grpc as pb_grpc

    engine, runtime = recording_engine(tiny_model_repo, TINY_MODEL_NAME, INLINE_ENCODING)  # exact step counts
    alone = load_engine(find_models(tiny_model_repo)[TINY_MODEL_NAME], RuntimeOptions(), ALONE)
    long = text(TINY_MODEL_NAME, 0, new=30, at_least=30)
    victim = pb.GenerateRequest(model=TINY_MODEL_NAME, text=pb.TextInput(text=MIXED_TEXTS[4]), target_language="en",
                                decoding=pb.DecodingOptions(max_new_tokens=30, min_new_tokens=30))
    victim_length = engine.prepare(GenerationRequest(TINY_MODEL_NAME, MIXED_TEXTS[4], "en")).source.length
    assert victim_length != engine.prepare(long).source.length, "the test tells the rows apart by source length"
    started, queued, cancelled = threading.Event(), threading.Event(), threading.Event()
    cancel = engine.cancel
    engine.cancel = lambda future: (cancel(future), cancelled.set())  # what the service calls when it gives up

    def hold(token):  # the long request's callback, on the worker
        if token.index == 0:  # the victim is queued before the next step: it is admitted there
            started.set()
            assert queued.wait(WAIT)
        if token.index == 2:  # the victim has run two steps; it keeps running until its deadline has passed
            assert cancelled.wait(WAIT)

    try:
        with app.BackgroundServer({TINY_MODEL_NAME: engine}) as background, \
                grpc.insecure_channel(background.address) as channel:
            first = engine.submit(long, hold)
            assert started.wait(WAIT)
            call = pb_grpc.AttnServeStub(channel).Generate.future(victim, timeout=1.0)
            while not engine.queued():
                assert not call.done(), call.exception()
                threading.Event().wait(0.005)
            queued.set()
            assert call.exception(WAIT).code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert_same(first.result(WAIT), alone.generate(long, WAIT))
    finally:
        engine.close()
        alone.close()
    # Steps 2 and 3 ran the victim; the cancel, seen after step 3, dropped its row in step 4.
    assert runtime.calls_with(victim_length) == 3 and len(runtime.steps) == 30


def test_an_idle_worker_starts_a_lone_request_at_once(tiny_model_repo):
    # A window far longer than the wait: a lone request that waited for it would time out.
    engine = load_engine(find_models(tiny_model_repo)[TINY_MODEL_NAME], RuntimeOptions(),
                         BatchingOptions(window_ms=10000.0 * WAIT))
    try:
        for i in range(3):
            result = engine.generate(text(TINY_MODEL_NAME, i, new=4), WAIT)
            assert result.timings.batch_size == 1 and result.timings.queue_seconds < WAIT
    finally:
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

    def flaky(feeds, residency=None):
        if not failed and len(next(iter(feeds.values()))) > 1:  # once, on the first shared step
            failed.append(True)
            raise RuntimeError("injected")
        return step(feeds, residency)

    monkeypatch.setattr(continuous.runtime, "decode_step", flaky)
    assert_shared_requests_equal_alone(continuous, alone)
    assert failed


def assert_shared_requests_equal_alone(engine, alone, trigger=None, late=None):
    """A trigger request, and late ones that join it at its second token, each give what they give alone (say
    after a fault injected into their shared steps); closes both engines. By default a greedy trigger and
    one beam-2 request."""
    trigger = trigger or text(TINY_MODEL_NAME, 0, new=10, at_least=10)
    late = late or [text(TINY_MODEL_NAME, 1, beam=2)]
    try:
        first, futures = submit_after(engine, trigger, late, tokens=2)
        for request, future in zip([trigger, *late], [first, *futures]):
            assert_same(future.result(WAIT), alone.generate(request, WAIT))
    finally:
        engine.close()
        alone.close()
