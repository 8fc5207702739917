"""What an operator sees: `attnserve --version`, help on every flag, and `serve --log-format json` writing
nothing but JSON lines (ONNX Runtime's own lines included) with timezone-aware times, a start report, and
a request id on every access line."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import subprocess
import sys
import textwrap

import grpc
import pytest

from attnserve.clients import cli
from attnserve.server.edge import native_log
from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from conftest import TINY_MODEL_NAME
from served_process import WAIT, free_port


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("attnserve 0.1.0")


def _flags(parser: argparse.ArgumentParser, path: tuple[str, ...]):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _flags(sub, (*path, name))
        elif action.help != argparse.SUPPRESS:
            yield path, action


def test_every_flag_has_help():
    bare = [(path, action.option_strings or action.dest) for path, action in _flags(cli._parser(), ("attnserve",))
            if len((action.help or "").replace("(default: %(default)s)", "").split()) < 2]
    assert bare == []


def test_onnx_runtime_lines_become_records():
    coloured = ("\x1b[0;93m2026-12-01 21:00:00.1 [W:onnxruntime:Default, device_discovery.cc:164 "
                "DiscoverDevicesForPlatform] GPU device discovery failed\x1b[m\n")
    assert native_log.record(coloured) == (
        "onnxruntime", logging.WARNING, "GPU device discovery failed (device_discovery.cc:164 DiscoverDevicesForPlatform)"
    )
    assert native_log.record("segfault handler: something\n") == ("stderr", logging.WARNING, "segfault handler: something")


def test_a_real_onnx_runtime_session_logs_json_only(tmp_path):
    """ONNX Runtime at its verbose level writes many lines to descriptor 2 while a session loads: all JSON."""
    script = textwrap.dedent("""
        import onnxruntime, pathlib, logging
        from attnserve.server.decoding import log_softmax
        from attnserve.server.edge import logging_setup
        logging_setup.configure("debug", "json", native=True)
        onnxruntime.set_default_logger_severity(0)
        graph = pathlib.Path(log_softmax.__file__).with_name("log_softmax.onnx")
        onnxruntime.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        logging.getLogger("x").info("done")
        import time; time.sleep(0.5)  # the forwarding thread drains the pipe
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=WAIT)
    assert run.returncode == 0, run.stderr
    lines = [json.loads(line) for line in run.stderr.splitlines()]  # raises on any line that is not JSON
    assert any(entry["logger"] == "onnxruntime" for entry in lines), run.stderr[:2000]
    assert lines[-1]["message"] == "done" or any(e["message"] == "done" for e in lines)


def test_serve_logs_json_with_a_start_report_and_request_ids(tiny_model_repo, tmp_path):
    port, metrics_port = free_port(), free_port()
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "attnserve.clients.cli", "serve", "--models", str(tiny_model_repo), "--host",
               "127.0.0.1", "--port", str(port), "--metrics-port", str(metrics_port), "--log-format", "json"]
    with open(log, "w") as stderr:
        process = subprocess.Popen(command, stderr=stderr, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                grpc.channel_ready_future(channel).result(timeout=WAIT)
                stub = pb_grpc.AttnServeStub(channel)
                stub.Generate(pb.GenerateRequest(model=TINY_MODEL_NAME, text=pb.TextInput(text="知識")), timeout=WAIT)
                stub.Generate(pb.GenerateRequest(model=TINY_MODEL_NAME, text=pb.TextInput(text="知識"),
                                                 request_id="mine"), timeout=WAIT)
        finally:
            process.terminate()
            process.wait(timeout=WAIT)
    entries = [json.loads(line) for line in log.read_text().splitlines()]  # every line is JSON
    times = [datetime.datetime.fromisoformat(e["time"]) for e in entries]
    assert all(t.utcoffset() == datetime.timedelta(0) for t in times)
    messages = [e["message"] for e in entries if e["logger"] == "attnserve.startup"]
    assert any(m.startswith(f"model {TINY_MODEL_NAME} version 1:") and "provider CPUExecutionProvider" in m
               for m in messages), messages
    assert f"metrics: http://127.0.0.1:{metrics_port}/metrics" in messages
    assert any(m.startswith("limits: max_queue_size 256") for m in messages)
    ids = [e["request_id"] for e in entries if e["logger"] == "attnserve.access"]
    assert len(ids) == 2 and ids[0].startswith("gen-") and len(ids[0]) == 20 and ids[1] == "mine"


def test_web_checks_its_own_listener_flags(tmp_path):
    pytest.importorskip("aiohttp", reason="the web gateway needs the `web` extra (aiohttp)")
    with pytest.raises(SystemExit, match="--http-tls-cert and --http-tls-key go together"):
        cli.main(["web", "--http-tls-cert", str(tmp_path / "cert.pem")])
    (tmp_path / "empty").write_text("# no token\n")
    with pytest.raises(SystemExit, match="holds no token"):
        cli.main(["web", "--http-token-file", str(tmp_path / "empty")])
    with pytest.raises(SystemExit, match="--http-tls-cert .*cert.pem"):
        cli.main(["web", "--http-tls-cert", str(tmp_path / "cert.pem"), "--http-tls-key", str(tmp_path / "k.pem")])
