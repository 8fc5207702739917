"""Shutdown: the drain (health NOT_SERVING, new calls UNAVAILABLE, in-flight calls finish), and signals in a
real process: SIGTERM under load loses no accepted request and exits 0; a second signal stops at once,
cleanly (exit 0, not SIGABRT), saying how many requests it cut off.
"""

from __future__ import annotations

import asyncio
import pathlib
import signal
import subprocess
import sys
import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from attnserve.server.edge import app
from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from fakes import WAIT, FakeEngine

REQUEST = pb.GenerateRequest(model="fake-translate", text=pb.TextInput(text="hello"))
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _wait_for(predicate) -> None:
    pause = threading.Event()
    for _ in range(WAIT * 100):
        if predicate():
            return
        pause.wait(0.01)
    raise AssertionError("timed out")


def test_drain_reports_not_serving_refuses_new_calls_and_finishes_in_flight_ones():
    engine = FakeEngine()
    engine.gate.clear()
    background = app.BackgroundServer({engine.info.name: engine})
    try:
        with grpc.insecure_channel(background.address) as channel:
            generate = pb_grpc.AttnServeStub(channel).Generate
            health = health_pb2_grpc.HealthStub(channel)
            held = generate.future(REQUEST, timeout=WAIT)
            _wait_for(lambda: engine.requests)
            draining = asyncio.run_coroutine_threadsafe(background.server.drain(WAIT), background._loop)
            _wait_for(lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=WAIT).status == NOT_SERVING)
            with pytest.raises(grpc.RpcError) as refused:
                generate(REQUEST, timeout=WAIT)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "shutting down" in refused.value.details()
            engine.gate.set()
            assert held.result().text == "olleh"
            outcome = draining.result(WAIT)
            assert (outcome.finished, outcome.cut_off) == (1, 0)
    finally:
        background.stop()
    assert engine.closed


# A server process whose fake model answers after `DELAY` seconds, or never (DELAY < 0) until cancelled.
_SERVER_SCRIPT = """
import asyncio, os, sys, threading, time
sys.path.insert(0, {tests!r})
from fakes import FakeEngine
from attnserve.server.edge import app, logging_setup

DELAY = float(sys.argv[1])
HANG_ON_CLOSE = len(sys.argv) > 3

class SlowEngine(FakeEngine):
    def close(self, timeout=None):
        if HANG_ON_CLOSE:  # an engine that never finishes closing (a child finishing a long batch)
            os.write(1, b"closing\\n")
            threading.Event().wait()
        super().close(timeout)

    def _generate(self, request, on_token, stop):
        os.write(1, b"started\\n")  # one write per line: print() from several threads can interleave
        if DELAY < 0:
            stop.wait()  # until cancelled
        else:
            time.sleep(DELAY)
        return super()._generate(request, on_token, stop)

async def main():
    engine = SlowEngine()
    engine._worker._max_workers = 8  # several requests in progress at once
    server = await app.start({{engine.info.name: engine}}, "127.0.0.1:0")
    print("port", server.port, flush=True)
    await app.serve_until_signal(server, grace=float(sys.argv[2]))

logging_setup.configure("info", "text")
asyncio.run(main())
"""


def _start_server(delay: float, grace: float, hang_on_close: bool = False) -> tuple[subprocess.Popen, str]:
    script = _SERVER_SCRIPT.format(tests=str(pathlib.Path(__file__).parent))
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(delay), str(grace), *(["hang"] if hang_on_close else [])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()
    assert line.startswith("port "), process.stderr.read()
    return process, f"127.0.0.1:{line.split()[1]}"


def _read_started(process: subprocess.Popen, count: int) -> None:
    for _ in range(count):
        assert process.stdout.readline().strip() == "started"


def test_sigterm_under_load_finishes_every_accepted_request_and_exits_0():
    process, address = _start_server(delay=0.3, grace=WAIT)
    try:
        with grpc.insecure_channel(address) as channel:
            generate = pb_grpc.AttnServeStub(channel).Generate
            accepted = [generate.future(REQUEST, timeout=WAIT) for _ in range(6)]
            _read_started(process, 6)  # all six are running
            process.send_signal(signal.SIGTERM)
            assert [f.result().text for f in accepted] == ["olleh"] * 6  # none of the accepted ones is lost
        assert process.wait(WAIT) == 0
    finally:
        process.kill()
        log = process.stderr.read()
    assert "drained: 6 in-flight requests finished, 0 cut off" in log


def test_a_second_signal_stops_at_once_cleanly_and_says_what_it_cut_off():
    process, address = _start_server(delay=-1, grace=WAIT)
    try:
        with grpc.insecure_channel(address) as channel:
            generate = pb_grpc.AttnServeStub(channel).Generate
            health = health_pb2_grpc.HealthStub(channel)
            held = generate.future(REQUEST, timeout=WAIT)
            _read_started(process, 1)
            process.send_signal(signal.SIGINT)
            _wait_for(lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=WAIT).status == NOT_SERVING)
            with pytest.raises(grpc.RpcError) as refused:
                generate(REQUEST, timeout=WAIT)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            process.send_signal(signal.SIGINT)
            assert process.wait(WAIT) == 0  # not -SIGABRT
            assert held.exception() is not None  # cut off, not answered
    finally:
        process.kill()
        log = process.stderr.read()
    assert "second SIGINT: stopping now" in log
    assert "1 in-flight requests cut off" in log
    assert "terminate called" not in log


@pytest.mark.parametrize("second_signal", [False, True])
def test_an_engine_that_never_closes_does_not_keep_the_process_alive(second_signal):
    """The close after the drain is bounded (app.CLOSE_SECONDS), and a second signal during it ends the
    wait at once: the whole stop fits terminationGracePeriodSeconds. Before, it waited on the engines for as
    long as they took (--engine-process: 32 s after SIGTERM, 21 s after a second SIGINT)."""
    process, address = _start_server(delay=0, grace=0, hang_on_close=True)
    try:
        with grpc.insecure_channel(address) as channel:  # answered: the loop is past installing its handlers
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=WAIT)
        process.send_signal(signal.SIGTERM)
        assert process.stdout.readline().strip() == "closing"
        if second_signal:
            process.send_signal(signal.SIGTERM)
        assert process.wait(WAIT) == 0
    finally:
        process.kill()
        log = process.stderr.read()
    if second_signal:
        assert "not waiting for the engines to close" in log
    else:
        assert "1 models did not close in 5.0 s; exiting without them" in log

