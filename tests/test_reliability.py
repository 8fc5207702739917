"""Reliability: bounded memory under oversized requests, request limits per model, errors after validation
reported as INTERNAL, an injected runtime fault that fails only its own request, degenerate text, broken
models skipped beside healthy ones, and health's List.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import shutil
import subprocess
import sys
import threading
import traceback

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from attnserve.api import generation
from attnserve.server.edge import app
from attnserve.server.engine import limits
from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from fakes import WAIT, FakeEngine, recording_engine
from served_process import rss_mib

TINY = "tiny-translate"


def _status(call) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


# ---- memory: oversized requests are refused before they cost memory -------------------------------------




@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_oversized_requests_leave_no_memory_behind(tiny_model_repo, tmp_path):
    """The issue's repro: rounds of 16 concurrent 30 MiB requests took the server from ~180 MB to 2.7 GB."""
    port = _free_port()
    command = [sys.executable, "-m", "attnserve.clients.cli", "serve", "--models", str(tiny_model_repo)]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    log = open(tmp_path / "server.log", "w+")
    server = subprocess.Popen(command, stderr=log)
    options = [("grpc.max_send_message_length", 64 << 20)]
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            grpc.channel_ready_future(channel).result(timeout=WAIT)
            generate = pb_grpc.AttnServeStub(channel).Generate
            ok = pb.GenerateRequest(model=TINY, text=pb.TextInput(text="hello"))
            huge = pb.GenerateRequest(model=TINY, text=pb.TextInput(text="知" * (10 << 20)))  # 30 MiB of UTF-8
            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                # Warm every thread and buffer normal traffic uses, then measure.
                assert set(pool.map(lambda _: _status(lambda: generate(ok, timeout=WAIT)), range(32))) == {
                    grpc.StatusCode.OK
                }
                before = rss_mib(server.pid)
                for _ in range(3):
                    codes = set(pool.map(lambda _: _status(lambda: generate(huge, timeout=4 * WAIT)), range(16)))
                    assert codes == {grpc.StatusCode.RESOURCE_EXHAUSTED}
                after = rss_mib(server.pid)
            assert _status(lambda: generate(ok, timeout=WAIT)) == grpc.StatusCode.OK
        assert after <= 1.25 * before, f"RSS grew from {before:.0f} MiB to {after:.0f} MiB"
    finally:
        server.kill()
        server.wait()
        log.close()


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# ---- request limits ---------------------------------------------------------------------------------------


def test_peek_reads_the_model_name_without_parsing_the_rest():
    request = pb.GenerateRequest(model="m" * 200, text=pb.TextInput(text="x" * 100_000), request_id="r")
    assert limits.peek_string_field(request.SerializeToString(), 1) == "m" * 200
    assert limits.peek_string_field(pb.GenerateRequest(text=pb.TextInput(text="a")).SerializeToString(), 1) is None
    assert limits.peek_string_field(b"\xff\xff\xff", 1) is None  # malformed: the parser decides


def test_message_limits_follow_each_input_kind(tiny_server):
    _, engines = tiny_server
    text = engines[TINY]
    assert limits.input_bytes(text.info, text.max_text_chars) == 48 * text.tokenizer.max_piece_chars * 4
    audio = dataclasses.replace(
        text.info,
        input_kind=generation.InputKind.AUDIO,
        audio=generation.AudioInputInfo(16000, 30.0, 2_000_000, 0.04),
    )
    assert limits.input_bytes(audio) == 2_000_000
    assert limits.request_bytes(2_000_000) > 2_000_000


class _AudioFake(FakeEngine):
    """A fake that says it reads audio of up to 1 MB, so the server's receive limit is about that."""

    def __init__(self):
        super().__init__("fake-audio")
        audio = generation.AudioInputInfo(16000, 30.0, 1_000_000, 0.04)
        self.info = dataclasses.replace(self.info, input_kind=generation.InputKind.AUDIO, audio=audio)


def _rejected(model: str, code: str, reason: str) -> float:
    labels = {"model": model, "code": code, "reason": reason}
    return REGISTRY.get_sample_value("attnserve_rejected_requests_total", labels) or 0.0


def test_requests_over_their_models_limit_are_refused_before_parsing():
    text, audio = FakeEngine(), _AudioFake()
    too_large = _rejected("fake-translate", "OUT_OF_RANGE", "too_large")
    receive_limit = _rejected("", "RESOURCE_EXHAUSTED", "receive_limit")
    with app.BackgroundServer({text.info.name: text, audio.info.name: audio}) as background:
        with grpc.insecure_channel(background.address, options=[("grpc.max_send_message_length", 8 << 20)]) as ch:
            generate = pb_grpc.AttnServeStub(ch).Generate
            # Within the server's limit (the audio model's) but over the text model's: refused unparsed.
            big_text = pb.GenerateRequest(model="fake-translate", text=pb.TextInput(text="a" * 200_000))
            with pytest.raises(grpc.RpcError) as refused:
                generate(big_text, timeout=WAIT)
            assert refused.value.code() == grpc.StatusCode.OUT_OF_RANGE
            assert "model 'fake-translate' accepts requests of at most" in refused.value.details()
            # Over every model's limit: gRPC itself refuses it.
            huge = pb.GenerateRequest(model="fake-audio", audio=pb.AudioInput(data=b"\0" * 2_000_000))
            with pytest.raises(grpc.RpcError) as exhausted:
                generate(huge, timeout=WAIT)
            assert exhausted.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert text.requests == [] and audio.requests == []
    # Both refusals are counted, though neither reached the servicer (the second not even Python).
    assert _rejected("fake-translate", "OUT_OF_RANGE", "too_large") == too_large + 1
    _wait_for(lambda: _rejected("", "RESOURCE_EXHAUSTED", "receive_limit") == receive_limit + 1)


def test_unparsable_bytes_are_invalid_argument_and_counted():
    engine = FakeEngine()
    before = _rejected("", "INVALID_ARGUMENT", "unparsable")
    with app.BackgroundServer({engine.info.name: engine}) as background, \
            grpc.insecure_channel(background.address) as channel:
        raw = channel.unary_unary("/attnserve.v1.AttnServe/Generate")  # bytes in, bytes out
        with pytest.raises(grpc.RpcError) as refused:
            raw(b"\x0a\x05\xff\xfe\xfd\xfc\xfb", timeout=WAIT)  # field 1 (model) is not UTF-8
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _rejected("", "INVALID_ARGUMENT", "unparsable") == before + 1
    assert engine.requests == []


def test_inflight_budget_refuses_what_does_not_fit_and_frees_it_after():
    engine = FakeEngine()
    engine.gate.clear()
    large = pb.GenerateRequest(model="fake-translate", text=pb.TextInput(text="ab" * 7_500))  # ~15 kB
    with app.BackgroundServer({engine.info.name: FakeEngine()}) as probe:
        budget = probe.server.limits.receive_bytes  # the least a server takes: one largest request
    assert budget < 2 * large.ByteSize()
    inflight = _rejected("fake-translate", "RESOURCE_EXHAUSTED", "inflight_bytes")
    with app.BackgroundServer({engine.info.name: engine}, max_inflight_bytes=budget) as background:
        with grpc.insecure_channel(background.address) as channel:
            generate = pb_grpc.AttnServeStub(channel).Generate
            held = generate.future(large, timeout=WAIT)
            _wait_for(lambda: engine.requests)
            with pytest.raises(grpc.RpcError) as refused:
                generate(large, timeout=WAIT)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max-inflight-request-mb" in refused.value.details()
            assert _rejected("fake-translate", "RESOURCE_EXHAUSTED", "inflight_bytes") == inflight + 1
            engine.gate.set()
            assert held.result().text == "babababa"
            assert generate(large, timeout=WAIT).text == "babababa"  # the bytes were given back


def test_budget_below_one_request_is_refused_naming_the_flag():
    engine = FakeEngine()
    with pytest.raises(ValueError, match="--max-inflight-request-mb"):
        app.BackgroundServer({engine.info.name: engine}, max_inflight_bytes=1000)


def _wait_for(predicate) -> None:
    done = threading.Event()
    for _ in range(WAIT * 100):
        if predicate():
            return
        done.wait(0.01)
    raise AssertionError("timed out")


# ---- errors after validation, injected faults ------------------------------------------------------------


class _FaultyRuntime:
    """Wraps a runtime: a decoder call whose batch holds a row of `poison_length` source tokens raises, as a
    shape bug deep in numpy would (a ValueError, which must not read as the client's fault)."""

    def __init__(self, recording, poison_length: int):
        self.recording = recording
        self.poison_length = poison_length
        self.faults = 0

    def __getattr__(self, name):
        return getattr(self.recording, name)  # everything but the two calls is the recording runtime's

    def encode(self, feeds):
        return self.recording.encode(feeds)

    def decode_step(self, feeds, residency=None):
        if self.poison_length in feeds[self.recording.source_mask].sum(axis=1):
            self.faults += 1
            raise ValueError("operands could not be broadcast together with shapes (3,4) (5,)")
        return self.recording.decode_step(feeds, residency)


def test_injected_runtime_error_fails_only_its_request_as_internal(tiny_model_repo, caplog):
    from attnserve.server.engine.batcher import BatchingOptions

    poison = "知" * 30
    engine, recording = recording_engine(tiny_model_repo, TINY, BatchingOptions(window_ms=200.0),
                                         wrap=lambda recording: _FaultyRuntime(recording, None))
    engine.runtime.poison_length = len(engine.tokenizer.encode(poison))
    texts = ["hello world", poison, "Open the file", "知識就是力量。"]
    with app.BackgroundServer({TINY: engine}) as background, grpc.insecure_channel(background.address) as channel:
        generate = pb_grpc.AttnServeStub(channel).Generate
        requests = [pb.GenerateRequest(model=TINY, text=pb.TextInput(text=t)) for t in texts]
        with caplog.at_level(logging.INFO, logger="attnserve.server"):
            futures = [generate.future(r, timeout=WAIT) for r in requests]
            outcomes = [_status(f.result) for f in futures]
        assert outcomes == [grpc.StatusCode.OK, grpc.StatusCode.INTERNAL, grpc.StatusCode.OK, grpc.StatusCode.OK]
        assert "could not be broadcast" in futures[1].exception().details()
        # The neighbours' answers are what they get alone; the server goes on.
        for i in (0, 2, 3):
            alone = generate(requests[i], timeout=WAIT)
            assert [t.id for t in futures[i].result().tokens] == [t.id for t in alone.tokens]
    assert engine.runtime.faults >= 1
    internal = [r for r in caplog.records if r.levelno == logging.ERROR and r.exc_info]
    assert len(internal) == 1 and "ValueError" in "".join(traceback.format_exception(*internal[0].exc_info))


def test_degenerate_text_is_invalid_argument(real_stub):
    for text in ["\u200b\u200b\u200b", "\ufeff", "\x00\x00\x00", "\u200d\ufeff \u2060\x00"]:
        request = pb.GenerateRequest(model=TINY, text=pb.TextInput(text=text))
        with pytest.raises(grpc.RpcError) as refused:
            real_stub.Generate(request, timeout=WAIT)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "invisible" in refused.value.details()
    ok = pb.GenerateRequest(model=TINY, text=pb.TextInput(text="\ufeffhello\u200b"))
    assert real_stub.Generate(ok, timeout=WAIT).tokens


@pytest.fixture(scope="module")
def real_stub(tiny_server):
    background, _ = tiny_server
    with grpc.insecure_channel(background.address) as channel:
        yield pb_grpc.AttnServeStub(channel)


def test_queue_full_is_resource_exhausted_and_the_server_goes_on():
    from attnserve.server.engine.batcher import Batcher, BatchingOptions

    release = threading.Event()

    def process(items):
        release.wait(WAIT)
        for index in range(len(items)):
            yield index, "done"

    batcher = Batcher(process, BatchingOptions(max_batch_size=1, max_queue_size=2), name="held")
    try:
        first = batcher.submit("a")
        _wait_for(lambda: batcher.queued() == 0)  # the worker holds the first one
        queued = [batcher.submit("b"), batcher.submit("c")]
        with pytest.raises(generation.OverloadedError, match="2 requests queued"):
            batcher.submit("d")
        release.set()
        assert [f.result(WAIT) for f in [first, *queued]] == ["done"] * 3
        assert batcher.submit("e").result(WAIT) == "done"
    finally:
        release.set()
        batcher.close()


# ---- broken models, health -------------------------------------------------------------------------------


def test_serving_only_named_models_never_reads_the_others(tiny_model_repo, tmp_path):
    """`attnserve serve --model NAME`: one model per deployment; a broken neighbour is not even opened."""
    from attnserve.server.edge import serve_options

    repo = tmp_path / "repo"
    shutil.copytree(tiny_model_repo, repo)
    (repo / "broken-model" / "1").mkdir(parents=True)
    (repo / "broken-model" / "1" / "manifest.json").write_text("not json")
    parser = serve_options.argparse.ArgumentParser()
    serve_options.add_arguments(parser)
    options = serve_options.from_args(parser.parse_args(["--models", str(repo), "--model", TINY]))
    assert options.only_models == (TINY,)
    engines = app.load_engines(options)
    try:
        assert list(engines) == [TINY]
    finally:
        app._close(engines)
    assert serve_options.from_args(parser.parse_args(["--models", str(repo)])).only_models == ()
    with pytest.raises(ValueError, match="not valid JSON"):
        app.load_engines(app.ServeOptions(models=str(repo)))
    with pytest.raises(ValueError, match=f"no model 'missing' in the repository; it has broken-model, {TINY}"):
        app.load_engines(app.ServeOptions(models=str(repo), only_models=("missing", TINY)))


def test_a_corrupt_model_beside_a_healthy_one_is_skipped_and_reported(tiny_model_repo, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(tiny_model_repo, repo)
    shutil.copytree(repo / TINY, repo / "broken-model")
    manifest = repo / "broken-model" / "1" / "manifest.json"
    manifest.write_text(manifest.read_text().replace(f'"{TINY}"', '"broken-model"'))
    decoder = next((repo / "broken-model" / "1").glob("decoder*.onnx"))
    decoder.write_bytes(b"not an onnx graph")

    with pytest.raises(ValueError, match="cannot load the graph"):
        app.load_models(app.ServeOptions(models=str(repo)))
    engines, broken = app.load_models(app.ServeOptions(models=str(repo), skip_broken_models=True))
    assert list(engines) == [TINY] and list(broken) == ["broken-model"]
    assert "cannot load the graph" in broken["broken-model"]
    with app.BackgroundServer(engines, broken=broken) as background, grpc.insecure_channel(background.address) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        listed = health.List(health_pb2.HealthListRequest(), timeout=WAIT).statuses
        serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
        assert {name: s.status for name, s in listed.items()} == {
            "": serving, app.SERVICE_NAME: serving, TINY: serving, "broken-model": not_serving
        }
        stub = pb_grpc.AttnServeStub(ch)
        with pytest.raises(grpc.RpcError) as refused:
            stub.GetModel(pb.GetModelRequest(name="broken-model"), timeout=WAIT)
        # Not UNAVAILABLE, which clients retry; and the reason, naming the server's files, is only logged.
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "failed to load" in refused.value.details() and str(tmp_path) not in refused.value.details()
        request = pb.GenerateRequest(model=TINY, text=pb.TextInput(text="hello"))
        assert stub.Generate(request, timeout=WAIT).tokens
