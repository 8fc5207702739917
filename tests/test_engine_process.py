"""A model's engine in a child process (server/edge/engine_process.py, `attnserve serve --engine-process`).

The decisive comparison: what the child's engine gives equals what the same engine gives in process, greedy
and beam, streamed or not, alone or many at once, text and speech, directly and over gRPC. Then the contract
the servicer relies on: validation errors raised by `submit`, the future marked running when the request
leaves the queue, cancellation queued and running, and what happens when the child goes away.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from concurrent.futures import CancelledError

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from attnserve.server.edge import app
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.edge.engine_process import ProcessEngine, load_process_engines
from attnserve.server.engine.registry import load_engines
from attnserve.api.generation import (
    AttentionOptions,
    AudioInput,
    DecodingOptions,
    GenerationRequest,
    UnavailableError,
)
from attnserve.server.model.runtime import RuntimeOptions
from attnserve.server.engine.scheduler import SchedulingOptions
from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from conftest import TINY_MODEL_NAME, TINY_SPEECH_NAME
from fakes import MIXED_TEXTS, WAIT
from test_service import wait_until

# One row at a time: a second request waits in the child's queue while the first runs.
ONE_ROW = BatchingOptions(continuous=SchedulingOptions(max_rows=1))


def request(text: str, target: str = "en", beam_size: int = 1, **decoding) -> GenerationRequest:
    return GenerationRequest(TINY_MODEL_NAME, text, target, DecodingOptions(beam_size=beam_size, **decoding))


REQUESTS = [request(t, "en" if i % 2 else "zh-TW", beam_size=1 + 2 * (i % 2)) for i, t in enumerate(MIXED_TEXTS)]


@pytest.fixture(scope="module")
def in_process(tiny_model_repo):
    registry = load_engines(tiny_model_repo, RuntimeOptions(), BatchingOptions())
    yield registry.get(TINY_MODEL_NAME)
    registry.close()


@pytest.fixture(scope="module")
def child(tiny_model_repo):
    engine = ProcessEngine(tiny_model_repo, TINY_MODEL_NAME)
    yield engine
    engine.close()


def test_outputs_equal_the_engine_in_process_alone_and_together(child, in_process):
    expected = [in_process.generate(r, WAIT) for r in REQUESTS]
    alone = [child.generate(r, WAIT) for r in REQUESTS]
    futures = [child.submit(r) for r in REQUESTS]  # all at once: they share the child's batches
    together = [f.result(WAIT) for f in futures]
    for want, one, many in zip(expected, alone, together):
        assert [t.id for t in one.tokens] == [t.id for t in want.tokens]
        assert [t.id for t in many.tokens] == [t.id for t in want.tokens]
        assert one.text == want.text
        assert [t.logprob for t in one.tokens] == pytest.approx([t.logprob for t in want.tokens], abs=1e-5)
    assert child.info == in_process.info
    assert child.providers == in_process.providers == ["CPUExecutionProvider"]  # the model_info metric's label


def test_streamed_tokens_arrive_in_order_and_match_the_result(child):
    events = []
    future = child.submit(request(MIXED_TEXTS[0], max_new_tokens=12), events.append)
    result = future.result(WAIT)
    assert [e.index for e in events] == list(range(len(result.tokens)))
    assert [e.token.id for e in events] == [t.id for t in result.tokens]


def test_invalid_requests_are_refused_by_submit_with_the_engines_message(child, in_process):
    bad = GenerationRequest(TINY_MODEL_NAME, "hello", "fr")
    with pytest.raises(ValueError) as in_child:
        child.submit(bad)
    with pytest.raises(ValueError) as at_home:
        in_process.submit(bad)
    assert str(in_child.value) == str(at_home.value)
    assert child.generate(REQUESTS[0], WAIT).tokens  # and the child goes on serving


def test_a_request_is_running_once_it_leaves_the_childs_queue(tiny_model_repo):
    engine = ProcessEngine(tiny_model_repo, TINY_MODEL_NAME, batching_options=ONE_ROW)
    try:
        futures, assigned, running_at_first_token = {}, {"first": threading.Event(), "second": threading.Event()}, {}

        def watch(name):
            def on_token(event):  # the reader thread; "accepted" came first, so submit has returned or is about to
                assigned[name].wait(WAIT)
                if event.index == 0:
                    running_at_first_token[name] = futures[name].running()
            return on_token

        for name, text, tokens in [("first", MIXED_TEXTS[0], 30), ("second", MIXED_TEXTS[1], 5)]:
            futures[name] = engine.submit(request(text, min_new_tokens=tokens, max_new_tokens=30), watch(name))
            assigned[name].set()
        # One row: the second waits in the child's queue until the first ends. The child reports the first's
        # end before the second's start, so the parent never sees the second running while the first is not done.
        assert not futures["second"].running() or futures["first"].done()
        for future in futures.values():
            assert future.result(WAIT).tokens
        assert running_at_first_token == {"first": True, "second": True}
    finally:
        engine.close()


def test_cancelling_queued_and_running_requests(tiny_model_repo):
    engine = ProcessEngine(tiny_model_repo, TINY_MODEL_NAME, batching_options=ONE_ROW)
    try:
        streamed, submitted, running = [], threading.Event(), None

        def cancel_at_first_token(event):
            streamed.append(event)
            if len(streamed) == 1:
                submitted.wait(WAIT)
                engine.cancel(running)  # from the reader thread, as a leaving handler may

        running = engine.submit(request(MIXED_TEXTS[2], min_new_tokens=40, max_new_tokens=40), cancel_at_first_token)
        submitted.set()
        queued = engine.submit(request(MIXED_TEXTS[3]))
        engine.cancel(queued)
        assert queued.cancelled()
        with pytest.raises(CancelledError):
            running.result(WAIT)
        assert len(streamed) < 40  # it stopped after a step or two, not at its 40th token
        after = engine.generate(REQUESTS[0], WAIT)  # the rows are free again
        assert after.tokens
    finally:
        engine.close()


def test_closing_cuts_off_the_running_request_instead_of_finishing_it(tiny_model_repo):
    """The parent closes its engines after the drain: what still runs is cut off. The child used to stop
    reading at "close" and finish its running batch, which took up to 20 s past Kubernetes' grace."""
    engine = ProcessEngine(tiny_model_repo, TINY_MODEL_NAME, batching_options=ONE_ROW)
    streamed, closing = [], []

    def close_at_first_token(event):
        streamed.append(event)
        if len(streamed) == 1:
            closing.append(threading.Thread(target=engine.close, args=(WAIT,)))
            closing[0].start()

    running = engine.submit(request(MIXED_TEXTS[2], min_new_tokens=40, max_new_tokens=40), close_at_first_token)
    with pytest.raises((CancelledError, UnavailableError)):
        running.result(WAIT)
    closing[0].join(WAIT)
    assert len(streamed) < 40  # cut off after a step or two, not finished


def test_a_child_that_goes_away_fails_what_was_pending_and_refuses_more(tiny_model_repo):
    engine = ProcessEngine(tiny_model_repo, TINY_MODEL_NAME, batching_options=ONE_ROW)
    held = threading.Event()
    pending = engine.submit(request(MIXED_TEXTS[0], min_new_tokens=30, max_new_tokens=30),
                            lambda _event: held.wait(WAIT))
    engine._process.kill()
    held.set()
    with pytest.raises(UnavailableError, match="engine process ended"):
        pending.result(WAIT)
    with pytest.raises(UnavailableError):
        engine.submit(REQUESTS[0])
    engine.close()


def test_a_model_that_fails_to_load_names_it(tiny_model_repo, tmp_path):
    import shutil

    broken = tmp_path / "repo"
    shutil.copytree(tiny_model_repo, broken)
    (broken / TINY_MODEL_NAME / "1" / "decoder.onnx").write_bytes(b"not a graph")
    with pytest.raises(ValueError, match=TINY_MODEL_NAME):
        ProcessEngine(broken, TINY_MODEL_NAME)
    reasons: dict[str, str] = {}
    assert load_process_engines(broken, RuntimeOptions(), BatchingOptions(), reasons) == {}
    assert TINY_MODEL_NAME in reasons


def test_served_over_grpc_equals_in_process(tiny_model_repo, in_process):
    engines = load_process_engines(tiny_model_repo, RuntimeOptions(), BatchingOptions())
    try:
        with app.BackgroundServer(engines) as background, grpc.insecure_channel(background.address) as channel:
            stub = pb_grpc.AttnServeStub(channel)
            for text, target in [(MIXED_TEXTS[0], "zh-TW"), (MIXED_TEXTS[1], "en")]:
                message = pb.GenerateRequest(model=TINY_MODEL_NAME, text=pb.TextInput(text=text),
                                             target_language=target)
                unary = stub.Generate(message, timeout=WAIT)
                streamed = list(stub.GenerateStream(message, timeout=WAIT))
                want = in_process.generate(GenerationRequest(TINY_MODEL_NAME, text, target), WAIT)
                assert [t.id for t in unary.tokens] == [t.id for t in want.tokens]
                assert [m.token.token.id for m in streamed[:-1]] == [t.id for t in want.tokens]
                assert streamed[-1].response.text == want.text
    finally:
        for engine in engines.values():
            engine.close()


def test_a_dead_engine_process_takes_the_server_out_of_service(tiny_model_repo):
    engines = load_process_engines(tiny_model_repo, RuntimeOptions(), BatchingOptions())
    try:
        with app.BackgroundServer(engines) as background, grpc.insecure_channel(background.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)

            def status(name: str):
                return health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status

            assert status("") == status(TINY_MODEL_NAME) == health_pb2.HealthCheckResponse.SERVING
            engines[TINY_MODEL_NAME]._process.kill()
            wait_until(lambda: status("") == health_pb2.HealthCheckResponse.NOT_SERVING)  # liveness restarts it
            assert status(TINY_MODEL_NAME) == health_pb2.HealthCheckResponse.NOT_SERVING
            message = pb.GenerateRequest(model=TINY_MODEL_NAME, text=pb.TextInput(text="hello"), target_language="en")
            with pytest.raises(grpc.RpcError) as refused:
                pb_grpc.AttnServeStub(channel).Generate(message, timeout=WAIT)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        for engine in engines.values():
            engine.close()


def test_the_serve_flag_loads_engines_in_child_processes(tiny_model_repo):
    options = app.ServeOptions(models=str(tiny_model_repo), engine_process=True)
    engines, broken = app.load_models(options)  # also warms each model up through its child
    try:
        assert broken == {}
        assert isinstance(engines[TINY_MODEL_NAME], ProcessEngine)
    finally:
        for engine in engines.values():
            engine.close()


def test_the_grpc_process_loads_no_onnxruntime_and_starts_no_helper_process(tiny_model_repo):
    # The point of its memory budget: the graphs run in the children only, and the children are the only
    # processes it starts (multiprocessing's spawn would add its resource tracker, another interpreter).
    script = f"""
import os, pathlib, sys
from attnserve.server.edge import app
engines, _ = app.load_models(app.ServeOptions(models={str(tiny_model_repo)!r}, engine_process=True))
children = [int(c) for t in pathlib.Path(f"/proc/{{os.getpid()}}/task").iterdir()
            for c in (t / "children").read_text().split()]
print("onnxruntime" in sys.modules, len(children))
for engine in engines.values():
    engine.close()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=WAIT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "1"]


def test_a_speech_model_in_a_child_gives_what_it_gives_in_process(tiny_speech_repo):
    from test_speech import wav

    requests = [GenerationRequest(TINY_SPEECH_NAME, audio=AudioInput(wav=wav(i)), attention=AttentionOptions(True),
                                  decoding=DecodingOptions(max_new_tokens=8, beam_size=1 + i % 2)) for i in range(3)]
    registry = load_engines(tiny_speech_repo, RuntimeOptions(), BatchingOptions())
    child = ProcessEngine(tiny_speech_repo, TINY_SPEECH_NAME)
    try:
        for want, got in zip([registry.get(TINY_SPEECH_NAME).generate(r, WAIT) for r in requests],
                             [f.result(WAIT) for f in [child.submit(r) for r in requests]]):
            assert [t.id for t in got.tokens] == [t.id for t in want.tokens]
            assert got.words == want.words  # word timestamps from the attention, as served in process
    finally:
        child.close()
        registry.close()
