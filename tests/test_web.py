"""The web gateway over HTTP against real tiny models: what the page gets for text and audio, and errors."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import pytest

pytest.importorskip("aiohttp", reason="the web gateway needs the `web` extra (aiohttp)")

from attnserve.clients.client import audio_request, translation_request  # noqa: E402
from attnserve.clients.web import payload  # noqa: E402
from conftest import TINY_MODEL_NAME, TINY_SPEECH_NAME  # noqa: E402
from fakes import WAIT, wav_bytes  # noqa: E402

import gateway_thread  # noqa: E402
from gateway_thread import BackgroundGateway  # noqa: E402

TEXT = "知識就是力量。"


def clip(seconds: float = 1.0, rate: int = 16000) -> bytes:
    t = np.arange(round(seconds * rate)) / rate
    return wav_bytes(0.3 * np.sin(2 * np.pi * (200 + 900 * t) * t), rate, "pcm16")


@pytest.fixture(scope="module")
def demo(tiny_model_repo, tiny_speech_repo):
    """(gateway url, client): the tiny translator and the tiny speech model on one server, behind the gateway."""
    with gateway_thread.demo(tiny_model_repo, tiny_speech_repo) as served:
        yield served


def call(url: str, body: bytes | None = None, content_type: str = "application/json") -> tuple[int, dict | str]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=WAIT) as response:
            status, data, kind = response.status, response.read(), response.headers.get_content_type()
    except urllib.error.HTTPError as error:
        status, data, kind = error.code, error.read(), error.headers.get_content_type()
    return status, json.loads(data) if kind == "application/json" else data.decode()


def test_the_page_and_its_scripts_are_served(demo):
    url, _ = demo
    status, page = call(url + "/")
    assert status == 200 and '<script type="module" src="/static/app.js">' in page
    for script in ("app.js", "attention.js", "wav.js"):
        status, source = call(f"{url}/static/{script}")
        assert status == 200 and ("export " in source or "import " in source)


def test_models_are_listed_with_their_input_kind(demo):
    url, client = demo
    status, models = call(url + "/api/models")
    assert status == 200
    assert [(m["name"], m["input_kind"]) for m in models] == [(TINY_SPEECH_NAME, "audio"), (TINY_MODEL_NAME, "text")]
    assert models == [payload.model_json(info) for info in client.list_models()]


def test_text_gets_the_served_result_with_word_attention(demo):
    url, client = demo
    status, body = call(f"{url}/api/generate?model={TINY_MODEL_NAME}&to=en", json.dumps({"text": TEXT}).encode())
    expected = client.generate(translation_request(TEXT, "en", True, "words", model=TINY_MODEL_NAME))
    assert status == 200
    assert body["text"] == expected.text and body["attention"]["weights"] == expected.attention.weights
    assert body["attention"]["col_labels"] == expected.attention.col_labels and body["columns"] == {"kind": "text"}
    assert body["attention"]["reduction"].endswith("words")


def test_text_without_a_language_goes_into_the_other_one(demo):
    url, _ = demo
    for text, language in ((TEXT, "en"), ("Knowledge is power.", "zh-TW")):
        status, body = call(f"{url}/api/generate?model={TINY_MODEL_NAME}", json.dumps({"text": text}).encode())
        assert status == 200 and body["target_language"] == language


def test_audio_gets_words_and_time_columns(demo):
    url, client = demo
    status, body = call(f"{url}/api/generate?model={TINY_SPEECH_NAME}", clip(), "audio/wav")
    expected = client.generate(audio_request(clip(), model=TINY_SPEECH_NAME, attention=True, granularity="words"))
    assert status == 200 and body["text"] == expected.text and body["words"]
    assert [w["word"] for w in body["words"]] == [w.word for w in expected.words]
    assert body["columns"]["kind"] == "time"
    spans = body["columns"]["spans"]
    assert len(spans) == len(expected.attention.col_labels) and spans[0] == [0.0, 0.04]
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


def test_audio_takes_the_pages_hotwords(demo):
    url, client = demo
    plain = client.generate(audio_request(clip(), model=TINY_SPEECH_NAME))
    hotwords = [w.word for w in plain.words][:2]  # words the tiny model writes
    query = urllib.parse.urlencode({"model": TINY_SPEECH_NAME, "hotwords": " ".join(hotwords)})
    status, body = call(f"{url}/api/generate?{query}", clip(), "audio/wav")
    expected = client.generate(audio_request(clip(), model=TINY_SPEECH_NAME, attention=True, granularity="words",
                                             hotwords=hotwords))
    assert status == 200 and body["text"] == expected.text
    assert [t["logprob"] for t in body["tokens"]] == pytest.approx([t.logprob for t in expected.tokens], abs=1e-5)
    status, body = call(f"{url}/api/generate?model={TINY_SPEECH_NAME}&hotwords=%E2%98%83", clip(), "audio/wav")
    assert status == 400 and body["error"]["code"] == "INVALID_ARGUMENT" and "never writes" in body["error"]["message"]


@pytest.mark.parametrize(
    "query, body, content_type, status, code, message",
    [
        ("model=nope", b'{"text": "abc"}', "application/json", 404, "NOT_FOUND", "unknown model 'nope'"),
        (f"model={TINY_MODEL_NAME}&to=en", b'{"text": ""}', "application/json", 400, "INVALID_ARGUMENT", "empty"),
        (f"model={TINY_MODEL_NAME}&to=en", b'{"text": "' + "力量".encode() * 50 + b'"}', "application/json",
         400, "INVALID_ARGUMENT", "accepts at most 48"),
        (f"model={TINY_SPEECH_NAME}", b"not a wav file", "audio/wav", 400, "INVALID_ARGUMENT", "WAV"),
        (f"model={TINY_SPEECH_NAME}", clip(4.0), "audio/wav", 400, "INVALID_ARGUMENT",
         "attention is not returned for long-form audio"),
        (f"model={TINY_MODEL_NAME}", clip(0.1), "audio/wav", 400, "INVALID_ARGUMENT", "text"),
        (f"model={TINY_MODEL_NAME}", b"{", "application/json", 400, "INVALID_ARGUMENT", "must be JSON"),
        (f"model={TINY_MODEL_NAME}", b"abc", "text/plain", 400, "INVALID_ARGUMENT", "cannot send text/plain"),
        ("", b'{"text": "abc"}', "application/json", 400, "INVALID_ARGUMENT", "name a model"),
    ],
    ids=["unknown-model", "empty-text", "too-many-tokens", "not-wav", "long-clip-with-attention", "audio-to-text-model",
         "bad-json", "bad-type", "no-model"],
)
def test_errors_are_json_with_the_servers_message(demo, query, body, content_type, status, code, message):
    url, _ = demo
    answered, error = call(f"{url}/api/generate?{query}", body, content_type)
    assert answered == status and set(error) == {"error"}
    assert error["error"]["code"] == code and message in error["error"]["message"]
    assert "Traceback" not in error["error"]["message"]


def test_an_unreachable_server_is_a_503_with_a_message():
    with BackgroundGateway("127.0.0.1:1", timeout=5) as web:
        status, error = call(web.url + "/api/models")
    assert status == 503 and error["error"]["code"] == "UNAVAILABLE" and error["error"]["message"]


def test_columns_name_what_they_stand_for():
    columns = payload._columns
    grid = {"kind": "grid", "boxes": [[0, 0, 32, 32], [32, 0, 64, 32]]}
    assert columns(["r0c0:0,0,32,32", "r0c1:32,0,64,32"]) == grid
    assert columns(["0.00-0.04", "0.04-0.08"]) == {"kind": "time", "spans": [[0.0, 0.04], [0.04, 0.08]]}
    assert columns(["0.00-0.04", "</s>"]) == columns(["r0c0:0,0,32,32", "cat"]) == {"kind": "text"}


def two_hours_of_flac() -> bytes:
    """A second of FLAC whose header says two hours: refused from the header, before any decoding."""
    import io

    import soundfile

    out = io.BytesIO()
    soundfile.write(out, np.zeros(16000), 16000, format="FLAC")
    data = bytearray(out.getvalue())
    fields = int.from_bytes(data[18:26], "big")  # STREAMINFO: rate, channels, bits, then 36 bits of samples
    data[18:26] = ((fields >> 36 << 36) | 2 * 3600 * 16000).to_bytes(8, "big")
    return bytes(data)


def test_a_long_recording_over_the_limit_is_refused_from_its_header(demo):
    url, _ = demo
    status, error = call(f"{url}/api/transcribe?model={TINY_SPEECH_NAME}", two_hours_of_flac(), "audio/flac")
    assert status == 413 and error["error"]["code"] == "OUT_OF_RANGE"
    assert "audio is 7200.00 s long" in error["error"]["message"] and "(long_form_max_seconds" in error["error"]["message"]
