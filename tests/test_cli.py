"""The `attnserve` command line, run against an in-process server."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from attnserve.clients import cli
from attnserve.clients.client import Client
from attnserve.api.generation import SamplingOptions, resolved_beam_size
from fakes import WAIT, wav_bytes

MODEL = "fake-translate"  # the fake_server's model


@pytest.fixture
def address(fake_server):
    background, _ = fake_server
    return background.address


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_translate_prints_the_translation(capsys, address):
    status, out, err = run(capsys, "translate", "abc", "--model", MODEL, "--address", address)
    assert (status, out, err) == (0, "cba\n", "")


def test_translate_json_is_the_whole_response(capsys, address):
    argv = ["translate", "我愛你", "--to", "zh-TW", "--attention", "--pieces", "--max-tokens", "2", "--json"]
    status, out, _ = run(capsys, *argv, "--model", MODEL, "--address", address)
    response = json.loads(out)
    assert status == 0
    assert response["text"] == "你愛" and response["target_language"] == "zh-TW"
    assert response["finish_reason"] == "length"
    assert [t["piece"] for t in response["source_tokens"]] == ["我", "愛", "你", "</s>"]
    assert response["attention"]["weights"][0] == [0.0, 0.0, 1.0, 0.0]
    assert set(response["timings"]) >= {"queue_seconds", "total_seconds", "batch_size"}


def test_translate_attention_draws_a_labelled_heatmap(capsys, address):
    status, out, _ = run(capsys, "translate", "我愛", "--attention", "--model", MODEL, "--address", address)
    lines = out.splitlines()
    assert status == 0 and lines[0] == "愛我"
    first_row = lines.index(next(line for line in lines if line.startswith("愛 ")))
    assert [line.split(" ")[0] for line in lines[first_row : first_row + 2]] == ["愛", "我"]
    # Vertical column labels end just above the rows: "我", "愛", then "</s>" written downwards.
    assert lines[first_row - 1].strip() == "我愛>"
    assert "\x1b[" not in out  # captured output is not a terminal
    assert lines[-1] == "layer 1 of 2, fake"


def test_models_lists_metadata(capsys, address):
    status, out, _ = run(capsys, "models", "--address", address)
    assert status == 0
    assert out.splitlines()[0] == f"{MODEL} (version 3, translation): reverses its input"
    assert "en, zh-TW -> en, zh-TW" in out


def test_errors_go_to_stderr_with_status(capsys, address):
    status, out, err = run(capsys, "translate", "abc", "--model", "nope", "--address", address)
    assert status == 1 and out == ""
    assert err == f"error: NOT_FOUND: unknown model 'nope'; available: {MODEL}\n"


def test_words_and_pieces_are_exclusive(capsys):
    with pytest.raises(SystemExit) as raised:
        cli.main(["translate", "abc", "--words", "--pieces"])
    assert raised.value.code == 2


def test_client_commands_do_not_import_onnxruntime():
    script = (
        "import sys\n"
        "from attnserve.clients import cli\n"
        "status = cli.main(['models', '--address', '127.0.0.1:1'])\n"
        "assert 'onnxruntime' not in sys.modules, 'onnxruntime was imported'\n"
        "sys.exit(status)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error: UNAVAILABLE: ")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_serve_answers_then_stops_on_sigterm(tiny_model_repo):
    port, metrics_port = _free_port(), _free_port()
    command = [sys.executable, "-m", "attnserve.clients.cli", "serve", "--models", str(tiny_model_repo)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(metrics_port)]
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=WAIT)  # the port opens once models are loaded
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=WAIT)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
        with Client(f"127.0.0.1:{port}", timeout=WAIT) as client:
            result = client.translate("Knowledge is power.", to="zh-TW", max_new_tokens=3, model="tiny-translate")
        assert 1 <= len(result.tokens) <= 3
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=WAIT) as page:
            metrics = page.read().decode()
        assert 'attnserve_requests_total{code="OK",model="tiny-translate"} 1.0' in metrics
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=WAIT) == 0
    finally:
        server.kill()
        _, log = server.communicate()
    assert "shutting down" in log


@pytest.mark.parametrize("text,target", [("知識就是力量", "en"), ("Open 檔案", "en"), ("Knowledge is power", "zh-TW")])
def test_translate_without_to_goes_to_the_other_language(capsys, address, text, target):
    status, out, _ = run(capsys, "translate", text, "--json", "--model", MODEL, "--address", address)
    assert status == 0 and json.loads(out)["target_language"] == target


@pytest.mark.parametrize("command", [["translate", "abcdef", "--json", "--model", MODEL], ["models"]])
def test_a_closed_pipe_ends_quietly(address, command):
    # `attnserve translate ... --json | head`: the reader is gone before the output is written.
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "attnserve.clients.cli", *command, "--address", address],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write)
    assert done.returncode == 1
    assert done.stderr == ""


def test_serve_with_a_port_out_of_range_is_an_error_not_a_traceback(tiny_model_repo):
    with pytest.raises(SystemExit, match="^error: --port 70000 is out of range"):
        cli.main(["serve", "--models", str(tiny_model_repo), "--port", "70000"])


def test_translate_passes_decoding_options(capsys, fake_server, address):
    _, engine = fake_server
    argv = ["translate", "abc", "--to", "en", "--beam-size", "4", "--max-tokens", "3", "--layer", "0"]
    status, _, _ = run(capsys, *argv, "--attention", "--model", MODEL, "--address", address)
    assert status == 0
    request = engine.requests[-1]
    assert (request.decoding.beam_size, request.decoding.max_new_tokens, request.attention.layer) == (4, 3, 0)
    assert (request.attention.heads, request.attention.reduction.value) == ((), "mean")
    status, _, _ = run(capsys, *argv, "--heads", "1,-1", "--head-reduction", "max", "--model", MODEL,
                       "--address", address)
    assert status == 0
    assert (engine.requests[-1].attention.heads, engine.requests[-1].attention.reduction.value) == ((1, -1), "max")


def test_heads_that_are_not_numbers_are_a_usage_error(capsys):
    with pytest.raises(SystemExit) as raised:
        cli.main(["translate", "abc", "--heads", "1,x"])
    assert raised.value.code == 2
    assert "'1,x' is not a comma-separated list of head numbers" in capsys.readouterr().err


def test_stream_prints_the_same_translation(capsys, address):
    status, streamed, _ = run(capsys, "translate", "abc", "--stream", "--model", MODEL, "--address", address)
    assert status == 0
    _, unary, _ = run(capsys, "translate", "abc", "--model", MODEL, "--address", address)
    assert streamed == unary == "cba\n"


def test_stream_on_the_real_model_prints_the_unary_text(capsys, tiny_server):
    address = tiny_server[0].address
    argv = ["translate", "Open the File menu", "--to", "zh-TW", "--model", "tiny-translate", "--address", address]
    _, unary, _ = run(capsys, *argv, "--max-tokens", "12")
    _, streamed, _ = run(capsys, *argv, "--max-tokens", "12", "--stream")
    assert streamed == unary


# ---- languages and input kinds come from the server ----------------------------------------------------


def _fake(name: str, sources: list[str], targets: list[str], **info):
    from fakes import FakeEngine

    engine = FakeEngine(name)
    engine.info = dataclasses.replace(engine.info, source_languages=sources, target_languages=targets, **info)
    return engine


@pytest.fixture(scope="module")
def other_languages():
    """(address, engines): fakes for ja <-> en, en -> fr, de <-> en, and an audio model."""
    from attnserve.server.edge import app
    from attnserve.api.generation import AudioInputInfo, InputKind

    speech = AudioInputInfo(sample_rate_hz=16000, max_seconds=30.0, max_bytes=1048576, seconds_per_column=0.04,
                            speeds=(1.0, 0.9, 1.1))
    engines = [
        _fake("ja-en", ["ja", "en"], ["ja", "en"]),
        _fake("en-fr", ["en"], ["fr"]),
        _fake("de-en", ["de", "en"], ["de", "en"]),
        _fake("speech", ["en"], ["en"], task="speech-recognition", input_kind=InputKind.AUDIO, audio=speech,
              max_source_tokens=750),
    ]
    with app.BackgroundServer({e.info.name: e for e in engines}) as background:
        yield background.address, {e.info.name: e for e in engines}


@pytest.mark.parametrize(
    "model,text,target",
    [
        ("ja-en", "東京の天気", "en"),
        ("ja-en", "とうきょう", "en"),
        ("ja-en", "Tokyo weather", "ja"),
        ("en-fr", "Open the file", "fr"),  # the only target language
        ("de-en", "Datei öffnen", ""),  # two Latin-script languages: the server's default decides
    ],
)
def test_translate_asks_the_server_for_the_models_languages(capsys, other_languages, model, text, target):
    address, engines = other_languages
    status, _, err = run(capsys, "translate", text, "--model", model, "--address", address)
    assert status == 0, err
    assert engines[model].requests[-1].target_language == target


def test_to_is_sent_as_given_without_asking(capsys, other_languages):
    address, engines = other_languages
    status, _, _ = run(capsys, "translate", "abc", "--to", "de", "--model", "de-en", "--address", address)
    assert status == 0 and engines["de-en"].requests[-1].target_language == "de"


def test_models_shows_each_input_kind_and_its_limits(capsys, other_languages):
    address, _ = other_languages
    status, out, _ = run(capsys, "models", "--address", address)
    lines = out.splitlines()
    names = [line.split(" ")[0] for line in lines if line[0] != " "]
    assert status == 0 and names == ["de-en", "en-fr", "ja-en", "speech"]
    speech = lines[lines.index(next(line for line in lines if line.startswith("speech "))) :][:5]
    assert speech[1] == (
        "  input: audio (WAV or samples, resampled to 16000 Hz), at most 30 s and 1048576 bytes; "
        "0.04 s per attention column; read at speeds 1, 0.9, 1.1"
    )
    assert speech[3] == "  limits: 750 attention columns, 8 new tokens"
    assert "  input: text" in lines


@pytest.mark.parametrize("flags, read_once", [((), False), (("--read-once",), True)])
def test_transcribe_asks_for_one_reading_with_read_once(capsys, other_languages, tmp_path, flags, read_once):
    address, engines = other_languages
    clip = tmp_path / "clip.wav"
    clip.write_bytes(wav_bytes(np.zeros(1600, dtype=np.float32), 16000))
    status, _, _ = run(capsys, "transcribe", str(clip), "--model", "speech", "--address", address, *flags)
    assert status == 0 and engines["speech"].requests[-1].decoding.read_once is read_once


def test_transcribe_sends_its_hotwords_and_their_boost(capsys, other_languages, tmp_path):
    address, engines = other_languages
    clip = tmp_path / "clip.wav"
    clip.write_bytes(wav_bytes(np.zeros(1600, dtype=np.float32), 16000))
    status, _, _ = run(capsys, "transcribe", str(clip), "--model", "speech", "--address", address,
                       "--hotwords", "ungawa", "joe king", "--hotword-boost", "1.5")
    decoding = engines["speech"].requests[-1].decoding
    assert status == 0 and decoding.hotwords == ("ungawa", "joe king") and decoding.hotword_boost == 1.5


@pytest.mark.parametrize(
    "sources,targets,text,target",
    [
        (["en", "zh-TW"], ["en", "zh-TW"], "知識就是力量", "en"),
        (["en", "zh-TW"], ["en", "zh-TW"], "Open 檔案", "en"),  # any CJK: Chinese text with an English name
        (["en", "zh-TW"], ["en", "zh-TW"], "Knowledge", "zh-TW"),
        (["ko", "en"], ["ko", "en"], "안녕하세요", "en"),
        (["ru", "en"], ["en", "ru"], "Привет", "en"),
        (["ru", "en"], ["en", "ru"], "Hello", "ru"),
        (["en", "zh-TW"], ["en", "zh-TW"], "12345", ""),  # no letters: no guess
        (["en", "zh-TW"], ["en", "zh-TW"], "Привет", ""),  # a script the model does not read
        (["en"], ["en"], "anything", "en"),
    ],
)
def test_default_target_guesses_the_source_language_by_script(sources, targets, text, target):
    from attnserve.clients import languages
    from attnserve.api.generation import ModelInfo

    info = ModelInfo("m", 1, "translation", "", sources, targets, 10, 10, 1, 1)
    assert languages.default_target(info, text) == target


def test_translate_passes_nbest_and_sampling_options(capsys, fake_server, address):
    _, engine = fake_server
    status, _, _ = run(capsys, "translate", "abc", "--nbest", "3", "--model", MODEL, "--address", address)
    decoding = engine.requests[-1].decoding
    # No --beam-size: the model's default search, which the server raises to the 3 sequences asked for.
    assert status == 0 and (decoding.beam_size, decoding.num_return_sequences, decoding.sampling) == (0, 3, None)
    assert resolved_beam_size(decoding, 1) == 3
    argv = ["--sample", "--temperature", "0.7", "--top-k", "5", "--top-p", "0.9", "--seed", "42"]
    status, _, _ = run(capsys, "translate", "abc", *argv, "--model", MODEL, "--address", address)
    decoding = engine.requests[-1].decoding
    assert status == 0 and resolved_beam_size(decoding, 4) == 1
    assert decoding.sampling == SamplingOptions(temperature=0.7, top_k=5, top_p=0.9, seed=42)


def test_sampling_flags_without_sample_are_an_error(capsys):
    with pytest.raises(SystemExit, match="--temperature, --seed only apply with --sample"):
        cli.main(["translate", "abc", "--temperature", "2", "--seed", "1", "--address", "127.0.0.1:1"])
