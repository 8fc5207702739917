"""The demo page in headless Chromium (Debian's, driven by Playwright): type, upload, hover, see the highlight.
Text, a WAV file, the microphone and a PNG image each go through the page to the tiny models behind the gateway.

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

from attnserve.clients.client import Client, audio_request, image_request, translation_request  # noqa: E402
from attnserve.server.edge import app  # noqa: E402
from conftest import TINY_MODEL_NAME, TINY_SPEECH_NAME  # noqa: E402
from fakes import WAIT, wav_bytes  # noqa: E402

import gateway_thread  # noqa: E402
import tiny_image  # noqa: E402
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
def tiny_image_repo(tmp_path_factory):
    """The tiny captioner with its attention sharpened (scores x 30, queries x 10): with random weights alone
    every word looks at the grid almost evenly, and the highlight should move from word to word as a trained
    model's does."""
    import torch

    model = tiny_image.captioner(seed=3)
    with torch.no_grad():
        model.speller.attention.v.weight.mul_(30)
        model.speller.attention.query_proj.weight.mul_(10)
    return tiny_image.export_repo(model, tmp_path_factory.mktemp("image_repo"))


@pytest.fixture(scope="module")
def demo(tiny_model_repo, tiny_speech_repo, tiny_image_repo):
    """(gateway url, client): the tiny translator, speech model and captioner on one server, behind the gateway."""
    with gateway_thread.demo(tiny_model_repo, tiny_speech_repo, tiny_image_repo) as served:
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
    assert confidence_marks(page, "#output span") == expected_marks(expected.words)

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


def test_the_hotwords_field_goes_with_the_clip(page, demo, tmp_path):
    url, client = demo
    t = np.arange(16000) / 16000
    clip = wav_bytes(0.3 * np.sin(2 * np.pi * (200 + 900 * t) * t), 16000, "pcm16")
    (tmp_path / "clip.wav").write_bytes(clip)
    plain = client.generate(audio_request(clip, model=TINY_SPEECH_NAME, attention=True, granularity="words"))
    hotwords = [w.word for w in plain.words][:2]
    open_page(page, url, TINY_SPEECH_NAME)
    page.fill("#hotwords", " ".join(hotwords))
    page.set_input_files("#audio-file", str(tmp_path / "clip.wav"))
    page.wait_for_selector("#output span")
    expected = client.generate(audio_request(clip, model=TINY_SPEECH_NAME, attention=True, granularity="words",
                                             hotwords=hotwords))
    assert page.inner_text("#output").split() == [w.word for w in expected.words]
    assert confidence_marks(page, "#output span") == expected_marks(expected.words)
    assert expected_marks(expected.words) != expected_marks(plain.words)  # the page sent the hotwords


def confidence_marks(page, selector: str) -> list[list]:
    """Each word's hover text and whether it is underlined as unsure."""
    return page.eval_on_selector_all(selector, "s => s.map(e => [e.title, e.classList.contains('unsure')])")


def expected_marks(words) -> list[list]:
    assert words and all(w.confidence is not None for w in words)
    return [[f"{int(w.confidence * 100 + 0.5)}% sure", w.confidence < 0.5] for w in words]


def shading(page) -> list[float]:
    """Each grid cell's shade as drawn: the alpha of its computed background colour."""
    script = "cells => cells.map(c => getComputedStyle(c).backgroundColor)"  # rgba(r, g, b, a), or rgb(r, g, b)
    colours = page.eval_on_selector_all("#cells .column", script)
    return [float(c.split(",")[3].rstrip(")")) if c.startswith("rgba") else 1.0 for c in colours]


def hover_a_caption_word(page, rows: list[list[float]], labels: list[str], row: int) -> int:
    """Hovers caption word `row`; checks every cell shows its weight and the peak cell lies on the picture where
    its label's pixel box says (the model's 16 x 16 pixels squeezed onto the shown image). Returns the peak."""
    page.hover(f'#output span[data-row="{row}"]')
    assert page.get_attribute(f'#output span[data-row="{row}"]', "class") == "active"
    np.testing.assert_allclose(weights(page, "#cells .column"), rows[row], atol=1e-4)
    np.testing.assert_allclose(shading(page), np.array(rows[row]) / max(rows[row]), atol=5e-3)
    peak = int(np.argmax(rows[row]))
    x0, y0, x1, y1 = (int(v) for v in labels[peak].split(":")[1].split(","))
    image = page.locator("#image").bounding_box()
    cell = page.locator(f'#cells .column[data-col="{peak}"]').bounding_box()
    side = tiny_image.config().image_size
    expected = [image["x"] + x0 / side * image["width"], image["y"] + y0 / side * image["height"],
                (x1 - x0) / side * image["width"], (y1 - y0) / side * image["height"]]
    np.testing.assert_allclose([cell["x"], cell["y"], cell["width"], cell["height"]], expected, atol=1)
    return peak


def test_upload_an_image_and_hover_its_words(page, demo, tmp_path):
    url, client = demo
    picture = tmp_path / "scene.png"
    picture.write_bytes(tiny_image.encode(tiny_image.pixels(96, 160, seed=1)))  # wider than the model's square
    open_page(page, url, tiny_image.NAME)
    assert page.is_visible("#image-input") and all(page.is_hidden(p) for p in ("#text-input", "#audio-input"))

    # The gateway's answer, kept on its way to the page: Response.json() finds this body already evicted from
    # Chromium's inspector cache, so a route fetches it, keeps a copy and passes it on.
    answers = []

    def record(route):
        response = route.fetch()
        answers.append((route.request.headers["content-type"], response.status, response.json()))
        route.fulfill(response=response)

    page.route("**/api/generate*", record)
    page.set_input_files("#image-file", str(picture))
    page.wait_for_selector("#output span")
    page.wait_for_function("() => document.getElementById('image').complete")
    assert page.eval_on_selector("#image", "i => [i.naturalWidth, i.naturalHeight]") == [160, 96]  # the upload

    # The page shows the gateway's answer, which is the server's answer to a direct call for the same file.
    [(content_type, status, answer)] = answers
    assert (content_type, status) == ("image/png", 200)
    request = image_request(picture.read_bytes(), model=tiny_image.NAME, attention=True, granularity="words")
    expected = client.generate(request).attention
    assert page.inner_text("#output").split() == expected.row_labels == answer["attention"]["row_labels"]
    np.testing.assert_allclose(answer["attention"]["weights"], expected.weights, atol=1e-6)
    assert page.is_visible("#picture") and all(page.is_hidden(p) for p in ("#source", "#timeline", "#error"))
    assert weights(page, "#cells .column") == [0.0] * 16  # a 4 x 4 grid, nothing hovered yet

    first = hover_a_caption_word(page, expected.weights, expected.col_labels, 0)
    page.screenshot(path=str(tmp_path / "caption.png"), full_page=True)
    assert (tmp_path / "caption.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A word that looked elsewhere moves the highlight there.
    elsewhere = [i for i, r in enumerate(expected.weights) if np.argmax(r) != first]
    assert elsewhere, "every word of the caption looked at the same cell"
    other = elsewhere[0]
    before = shading(page)
    assert hover_a_caption_word(page, expected.weights, expected.col_labels, other) != first
    assert not np.allclose(shading(page), before, atol=1e-2)
    assert page.get_attribute('#output span[data-row="0"]', "class") != "active"


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


def test_upload_a_long_recording_and_download_its_subtitles(page, demo, tmp_path):
    """Tones between pauses, longer than the tiny model's 3-s window: segments appear, then the subtitle links."""
    url, client = demo
    rate, parts = 16000, []
    for i in range(4):  # 1.2 s of chirp, 0.8 s of silence, four times: 8 s, four segments
        t = np.arange(round(1.2 * rate)) / rate
        parts += [0.3 * np.sin(2 * np.pi * (300 + 200 * i + 600 * t) * t), np.zeros(round(0.8 * rate))]
    (tmp_path / "long.wav").write_bytes(wav_bytes(np.concatenate(parts), rate, "pcm16"))
    open_page(page, url, TINY_SPEECH_NAME)
    page.set_input_files("#long-file", str(tmp_path / "long.wav"))
    page.wait_for_selector("body[data-transcribed=true]")
    expected = client.generate(audio_request((tmp_path / "long.wav").read_bytes(), model=TINY_SPEECH_NAME))
    assert len(expected.segments) == 4
    items = page.locator("#segments li").all_inner_texts()
    assert [item.split("  ", 1)[1] if "  " in item else "" for item in items] == [s.text for s in expected.segments]
    assert confidence_marks(page, "#segments li span") == expected_marks(expected.words)
    assert page.is_visible("#download-srt") and page.is_visible("#download-vtt")
    assert page.get_attribute("#download-srt", "download") == "long.srt"
    with page.expect_download() as download:
        page.click("#download-vtt")
    assert pathlib.Path(download.value.path()).read_text().startswith("WEBVTT")
    page.screenshot(path=str(tmp_path / "long.png"), full_page=True)
    # The same file through the ordinary upload (or a long recording from the microphone) goes the same way.
    page.reload()
    open_page(page, url, TINY_SPEECH_NAME)
    page.set_input_files("#audio-file", str(tmp_path / "long.wav"))
    page.wait_for_selector("body[data-transcribed=true]")
    assert page.locator("#segments li").count() == 4 and page.is_hidden("#result")
