"""The CLI's client commands added for clients and demos: PNG attention, health, credentials, `attnserve web`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from attnserve.clients import cli
from attnserve.clients.client import Client, audio_request
from attnserve.server.edge import app
from conftest import TINY_MODEL_NAME, TINY_SPEECH_NAME
from fakes import WAIT, FakeEngine, wav_bytes
from served_process import free_port

MODEL = "fake-translate"
PNG = b"\x89PNG\r\n\x1a\n"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture(scope="module")
def tiny(tiny_model_repo, tiny_speech_repo):
    """The address of a server with the tiny translator and the tiny speech model."""
    engines = {}
    for repo in (tiny_model_repo, tiny_speech_repo):
        engines.update(app.load_engines(app.ServeOptions(models=str(repo))))
    with app.BackgroundServer(engines) as server:
        yield server.address


def test_translate_attention_to_a_png(capsys, tiny, tmp_path):
    pytest.importorskip("matplotlib", reason="PNG output needs the `plot` extra (matplotlib)")
    out_png = tmp_path / "attention.png"
    status, out, _ = run(capsys, "translate", "知識就是力量。", "--to", "en", "--attention", str(out_png),
                         "--model", TINY_MODEL_NAME, "--address", tiny)
    with Client(tiny, timeout=WAIT) as client:
        text = client.translate("知識就是力量。", "en", model=TINY_MODEL_NAME).text
    assert status == 0 and out == f"{text}\nattention: {out_png}\n"
    assert out_png.read_bytes()[:8] == PNG


def test_transcribe_attention_to_a_png(capsys, tiny, tmp_path):
    pytest.importorskip("matplotlib", reason="PNG output needs the `plot` extra (matplotlib)")
    t = np.arange(16000) / 16000
    clip = wav_bytes(0.3 * np.sin(2 * np.pi * (200 + 900 * t) * t), 16000, "pcm16")
    (tmp_path / "clip.wav").write_bytes(clip)
    out_png = tmp_path / "timeline.png"
    status, out, _ = run(capsys, "transcribe", str(tmp_path / "clip.wav"), "--attention", str(out_png),
                         "--model", TINY_SPEECH_NAME, "--address", tiny)
    with Client(tiny, timeout=WAIT) as client:
        text = client.generate(audio_request(clip, model=TINY_SPEECH_NAME)).text
    assert status == 0 and out == f"{text}\nattention: {out_png}\n"
    assert out_png.read_bytes()[:8] == PNG


def test_attention_takes_only_a_png_path(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["translate", "--attention", "abc"])
    assert exited.value.code == 2
    assert "'abc' is not a .png path; to draw in the terminal, put --attention after" in capsys.readouterr().err


def test_health_reports_each_address(capsys, fake_server):
    background, _ = fake_server
    status, out, _ = run(capsys, "health", "--address", background.address)
    assert (status, out) == (0, f"{background.address}: SERVING\n")
    status, out, _ = run(capsys, "health", "--address", f"{background.address},127.0.0.1:1")
    assert (status, out) == (1, f"{background.address}: SERVING\n127.0.0.1:1: UNAVAILABLE\n")
    status, out, _ = run(capsys, "health", "--service", "no-such-model", "--address", background.address)
    assert (status, out) == (1, f"{background.address}: NOT_FOUND\n")  # the health protocol's answer


def test_a_token_file_authenticates_the_commands(capsys, tmp_path):
    (tmp_path / "token").write_text("s3cret\n")
    with app.BackgroundServer({MODEL: FakeEngine()}, tokens=frozenset({"s3cret"})) as server:
        status, out, _ = run(capsys, "translate", "abc", "--model", MODEL, "--address", server.address,
                             "--token-file", str(tmp_path / "token"))
        assert (status, out) == (0, "cba\n")
        status, _, err = run(capsys, "models", "--address", server.address)
        assert status == 1 and err.startswith("error: UNAUTHENTICATED: ")
    with pytest.raises(SystemExit, match="cannot read"):
        cli.main(["models", "--token-file", str(tmp_path / "missing")])


def test_attnserve_web_serves_the_page_for_a_running_server(fake_server):
    pytest.importorskip("aiohttp", reason="attnserve web needs the `web` extra (aiohttp)")
    background, engine = fake_server
    port = free_port()
    command = [sys.executable, "-m", "attnserve.clients.cli", "web", "--address", background.address,
               "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout.readline().startswith(f"attnserve web: http://127.0.0.1:{port}/")
        models = _get_when_up(f"http://127.0.0.1:{port}/api/models", process)
        assert [m["name"] for m in models] == [engine.info.name]
    finally:
        process.terminate()
        process.wait(timeout=WAIT)


def _get_when_up(url: str, process: subprocess.Popen):
    """GETs `url` as JSON once the gateway listens (it prints its address just before it binds)."""
    deadline = time.monotonic() + WAIT  # only guards against a hang
    while True:
        try:
            with urllib.request.urlopen(url, timeout=WAIT) as response:
                return json.loads(response.read())
        except urllib.error.URLError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
