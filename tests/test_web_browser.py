"""The demo page in headless Chromium (Debian's, driven by Playwright): type, upload, hover, see the highlight.

Skipped without Playwright or a Chromium executable (`apt-get install chromium`; Playwright's own browser
download is not used). Set ATTNSERVE_CHROMIUM to use another executable, and ATTNSERVE_DEMO_SCREENSHOT to a
path to also save the bundled translator's screenshot there (docs/demo.png was made so).
"""

from __future__ import annotations

import os
import pathlib
import shutil

import numpy as np
import pytest

pytest.importorskip("aiohttp", reason="the web gateway needs the `web` extra (aiohttp)")
sync_api = pytest.importorskip("playwright.sync_api", reason="the browser tests need Playwright (the `dev` extra)")

from attnserve.clients.client import Client, audio_request, translation_request  # noqa: E402
from attnserve.server import app  # noqa: E402
from conftest import TINY_MODEL_NAME, TINY_SPEECH_NAME  # noqa: E402
from fakes import WAIT, wav_bytes  # noqa: E402

import gateway_thread  # noqa: E402
from gateway_thread import BackgroundGateway  # noqa: E402

CHROMIUM = os.environ.get("ATTNSERVE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium executable: apt-get install chromium (or set ATTNSERVE_CHROMIUM)"
)
BUNDLED = pathlib.Path(__file__).resolve().parents[1] / "models"
MS = WAIT * 1000  # Playwright waits in milliseconds; only guards against hangs


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        # A fake microphone (a beep) lets the page record without a sound card or a permission prompt.
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream"],
        )
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def demo(tiny_model_repo, tiny_speech_repo):
    """(gateway url, client): the tiny translator and speech model on one server, behind the gateway."""
    with gateway_thread.demo(tiny_model_repo, tiny_speech_repo) as served:
        yield served


@pytest.fixture
def page(browser):
    page = browser.new_page(viewport={"width": 1000, "height": 700})
    page.set_default_timeout(MS)
    yield page
    page.close()


def open_page(page, url: str, model: str):
    page.goto(url)
    page.wait_for_selector("body[data-ready=true]")
    page.select_option("#model", model)


def weights(page, selector: str) -> list[float]:
    return [float(w) for w in page.eval_on_selector_all(selector, "cells => cells.map(c => c.dataset.weight)")]


def translate_and_hover(page, url: str, model: str, text: str, client: Client, row: int, screenshot: pathlib.Path):
    """Types `text`, waits for the translation, hovers output word `row`; checks the highlight is its row."""
    open_page(page, url, model)
    page.fill("#text", text)
    page.click("#translate")
    page.wait_for_selector("#output span")
    expected = client.generate(translation_request(text, "en", True, "words", model=model))
    assert page.inner_text("#output").split() == expected.attention.row_labels
    assert weights(page, "#source span") == [0.0] * len(expected.attention.col_labels)  # nothing hovered yet

    # Only the parts of a text model are shown.
    assert page.is_visible("#text-input") and page.is_visible("#source")
    assert all(page.is_hidden(part) for part in ("#audio-input", "#image-input", "#timeline", "#picture", "#error"))

    page.hover(f'#output span[data-row="{row}"]')
    shown = weights(page, "#source span")
    assert shown != [0.0] * len(shown)
    np.testing.assert_allclose(shown, expected.attention.weights[row], atol=1e-4)
    assert page.get_attribute(f'#output span[data-row="{row}"]', "class") == "active"
    page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return expected


def test_type_a_sentence_and_hover_its_words(page, demo, tmp_path):
    url, client = demo
    expected = translate_and_hover(page, url, TINY_MODEL_NAME, "知識就是力量。", client, 0, tmp_path / "translate.png")
    # Another word moves the highlight to that word's row.
    rows = expected.attention.weights
    other = next(i for i, r in enumerate(rows) if not np.allclose(r, rows[0], atol=1e-3))
    page.hover(f'#output span[data-row="{other}"]')
    np.testing.assert_allclose(weights(page, "#source span"), rows[other], atol=1e-4)


def test_a_server_error_is_shown_as_a_message(page, demo):
    url, _ = demo
    open_page(page, url, TINY_MODEL_NAME)
    page.fill("#text", "力量" * 50)
    page.click("#translate")
    message = page.wait_for_selector("#error:not([hidden])").inner_text()
    assert message.startswith("INVALID_ARGUMENT: source is") and "accepts at most 48" in message
    assert "Traceback" not in page.content()


def test_upload_a_clip_and_hover_its_words(page, demo, tmp_path):
    url, client = demo
    t = np.arange(16000) / 16000
    (tmp_path / "clip.wav").write_bytes(wav_bytes(0.3 * np.sin(2 * np.pi * (200 + 900 * t) * t), 16000, "pcm16"))
    open_page(page, url, TINY_SPEECH_NAME)
    page.set_input_files("#audio-file", str(tmp_path / "clip.wav"))
    page.wait_for_selector("#output span")
    clip = (tmp_path / "clip.wav").read_bytes()
    expected = client.generate(audio_request(clip, model=TINY_SPEECH_NAME, attention=True, granularity="words"))
    assert page.inner_text("#output").split() == [w.word for w in expected.words]
    assert page.is_visible("#timeline") and all(page.is_hidden(part) for part in ("#text-input", "#source", "#picture"))

    last = len(expected.words) - 1
    page.hover(f'#output span[data-row="{last}"]')
    np.testing.assert_allclose(weights(page, "#columns .column"), expected.attention.weights[last], atol=1e-4)
    # The word's time span is marked on the time line, as fractions of the clip's length.
    mark = page.eval_on_selector("#span-mark", "m => [m.style.left, m.style.width, getComputedStyle(m).display]")
    duration = float(expected.attention.col_labels[-1].split("-")[1])
    word = expected.words[last]
    assert mark[2] == "block"
    assert float(mark[0].rstrip("%")) == pytest.approx(word.start_seconds / duration * 100, abs=1e-2)
    width = (word.end_seconds - word.start_seconds) / duration * 100
    assert float(mark[1].rstrip("%")) == pytest.approx(width, abs=1e-2)
    page.screenshot(path=str(tmp_path / "transcribe.png"), full_page=True)


def test_record_from_the_microphone(page, demo):
    url, _ = demo
    open_page(page, url, TINY_SPEECH_NAME)
    page.click("#record")
    page.wait_for_selector("#record.recording")
    page.wait_for_timeout(800)  # record about a second of the fake microphone's beeps
    with page.expect_response(lambda r: "/api/generate" in r.url) as answered:
        page.click("#record")
    assert answered.value.request.headers["content-type"] == "audio/wav"
    # The page sent (and plays back) a WAV file it made itself: mono 16-bit PCM at 16 kHz.
    header = bytes(page.evaluate(
        "async () => [...new Uint8Array(await (await fetch(document.getElementById('player').src)).arrayBuffer())]"
        ".slice(0, 44)"
    ))
    assert header[:4] == b"RIFF" and header[8:16] == b"WAVEfmt "
    channels, rate = int.from_bytes(header[22:24], "little"), int.from_bytes(header[24:28], "little")
    assert (channels, rate, int.from_bytes(header[34:36], "little")) == (1, 16000, 16)
    assert answered.value.status == 200
    page.wait_for_selector("#output span")


@pytest.mark.bundled
def test_the_bundled_translator_on_the_page(page, tmp_path):
    repo = tmp_path / "models"  # the bundled Transformer alone: the other bundled models are not needed here
    repo.mkdir()
    (repo / "translate-zh-en").symlink_to(BUNDLED / "translate-zh-en")
    with app.BackgroundServer(app.load_engines(app.ServeOptions(models=str(repo)))) as server:
        with BackgroundGateway(server.address) as web, Client(server.address, timeout=WAIT) as client:
            expected = client.translate("Save the current document", "zh-TW", attention=True, model="translate-zh-en")
            row = max(range(len(expected.attention.row_labels)), key=lambda i: max(expected.attention.weights[i]))
            shot = tmp_path / "demo.png"
            page.goto(web.url)
            page.wait_for_selector("body[data-ready=true]")
            page.select_option("#model", "translate-zh-en")
            page.fill("#text", "Save the current document")
            page.click("#translate")
            page.wait_for_selector("#output span")
            page.hover(f'#output span[data-row="{row}"]')
            np.testing.assert_allclose(weights(page, "#source span"), expected.attention.weights[row], atol=1e-4)
            page.screenshot(path=str(shot), full_page=True)
    if os.environ.get("ATTNSERVE_DEMO_SCREENSHOT"):
        shutil.copy(shot, os.environ["ATTNSERVE_DEMO_SCREENSHOT"])
