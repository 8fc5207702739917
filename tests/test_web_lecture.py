"""The page as a lecturer drives it on a projector, in headless Chromium: it opens on a translator, words are
pinned by click and moved across with the arrow keys, the full matrix has a legend and numbers, layer and
head controls change what the server returns, the translators compare side by side, audio has a time axis,
images are shown large, samples fill the input, the view saves as a PNG and as a link.

Checked by structure (elements, sizes, contrast), never pixels. Screenshots go to $ATTNSERVE_SCREENSHOTS when
set (the closing note's are under /work/notes/screenshots/), else to the test's tmp dir.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import numpy as np
import pytest

pytest.importorskip("aiohttp", reason="the web gateway needs the `web` extra (aiohttp)")
sync_api = pytest.importorskip("playwright.sync_api", reason="the browser tests need Playwright (the `dev` extra)")

from attnserve.clients.client import translation_request  # noqa: E402
from conftest import TINY_MODEL_NAME, TINY_RECURRENT_NAME, TINY_SPEECH_NAME  # noqa: E402
from fakes import WAIT, wav_bytes  # noqa: E402
from test_web_browser import CHROMIUM, weights  # noqa: E402

import gateway_thread  # noqa: E402

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium executable: apt-get install chromium")
MS = WAIT * 1000
TEXT = "知識就是力量。"
SAMPLES = pathlib.Path(__file__).resolve().parents[1] / "clients" / "web" / "static" / "samples"


@pytest.fixture(scope="module")
def demo(tiny_model_repo, tiny_recurrent_dir, tiny_speech_repo, tmp_path_factory):
    """Both tiny translators and the tiny speech model behind one gateway."""
    repo = tmp_path_factory.mktemp("lecture_repo")
    for source in (tiny_model_repo / TINY_MODEL_NAME, tiny_recurrent_dir.parent):
        (repo / source.name).symlink_to(source)
    with gateway_thread.demo(repo, tiny_speech_repo) as served:
        yield served


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    # A projector's 1280 x 720.
    page = browser.new_page(viewport={"width": 1280, "height": 720}, accept_downloads=True)
    page.set_default_timeout(MS)
    yield page
    page.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> pathlib.Path:
    folder = os.environ.get("ATTNSERVE_SCREENSHOTS")
    path = pathlib.Path(folder) if folder else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def translated(page, url: str, text: str = TEXT) -> None:
    page.goto(url)
    page.wait_for_selector("body[data-ready=true]")
    page.select_option("#model", TINY_MODEL_NAME)
    page.fill("#text", text)
    page.click("#translate")
    page.wait_for_selector("#output span")


def luminance(rgb: str) -> float:
    channels = [int(c) / 255 for c in rgb[rgb.index("(") + 1 : rgb.index(")")].split(",")[:3]]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(page, selector: str, background: str = "body") -> float:
    """WCAG contrast ratio of `selector`'s text colour on its own background (or `background`'s when clear)."""
    colours = page.eval_on_selector(selector, "e => [getComputedStyle(e).color, getComputedStyle(e).backgroundColor]")
    back = colours[1] if not colours[1].startswith("rgba(0, 0, 0, 0)") else page.eval_on_selector(
        background, "e => getComputedStyle(e).backgroundColor")
    a, b = sorted([luminance(colours[0]), luminance(back)])
    return (b + 0.05) / (a + 0.05)


def test_opens_on_the_translator_in_large_readable_type(page, demo, shots):
    url, client = demo
    page.goto(url)
    page.wait_for_selector("body[data-ready=true]")
    opened = page.input_value("#model")
    assert client.get_model(opened).task == "translation"
    assert page.is_visible("#text-input") and page.is_hidden("#audio-input")
    translated(page, url)
    size = page.eval_on_selector("#output span", "e => parseFloat(getComputedStyle(e).fontSize)")
    assert size >= 36  # 2rem of a 20 px root: readable from the back of a room
    for selector in ("#status", "#output span", "header p", "#matrix th"):
        assert contrast(page, selector) >= 7, selector  # WCAG AAA
    status = page.inner_text("#status")
    expected = client.generate(translation_request(TEXT, "", True, "words", model=TINY_MODEL_NAME))
    assert status.startswith(f"{TINY_MODEL_NAME}: {len(expected.attention.row_labels)} words into en in ")
    assert status.endswith((" s, complete", " s, stopped at the length limit")) and "eos" not in status
    page.screenshot(path=str(shots / "lecture-translator.png"), full_page=True)


def test_click_pins_and_arrow_keys_move_across_words(page, demo, shots):
    url, client = demo
    translated(page, url)
    rows = client.generate(translation_request(TEXT, "en", True, "words", model=TINY_MODEL_NAME)).attention.weights
    page.click('#output span[data-row="0"]')
    assert "pinned" in page.get_attribute('#output span[data-row="0"]', "class")
    np.testing.assert_allclose(weights(page, "#source span"), rows[0], atol=1e-4)
    page.hover('#output span[data-row="1"]')  # pinned: hovering elsewhere changes nothing
    np.testing.assert_allclose(weights(page, "#source span"), rows[0], atol=1e-4)
    page.keyboard.press("ArrowRight")
    assert page.evaluate("document.activeElement.dataset.row") == "1"
    assert "pinned" in page.get_attribute('#output span[data-row="1"]', "class")
    np.testing.assert_allclose(weights(page, "#source span"), rows[1], atol=1e-4)
    assert page.get_attribute("#matrix tr.active", "data-row") == "1"
    page.keyboard.press("End")
    last = len(rows) - 1
    np.testing.assert_allclose(weights(page, "#source span"), rows[last], atol=1e-4)
    page.keyboard.press("ArrowRight")  # stays on the last word
    assert page.evaluate("document.activeElement.dataset.row") == str(last)
    page.screenshot(path=str(shots / "lecture-pinned.png"), full_page=True)
    page.keyboard.press("Escape")
    assert page.locator("#output span.pinned").count() == 0
    page.hover('#output span[data-row="0"]')  # unpinned: hovering follows again
    np.testing.assert_allclose(weights(page, "#source span"), rows[0], atol=1e-4)
    page.click('#output span[data-row="0"]')
    page.click('#output span[data-row="0"]')  # a second click lets go
    assert page.locator("#output span.pinned").count() == 0


def test_the_matrix_has_every_weight_and_a_legend(page, demo):
    url, client = demo
    translated(page, url)
    attention = client.generate(translation_request(TEXT, "en", True, "words", model=TINY_MODEL_NAME)).attention
    header = page.eval_on_selector_all("#matrix tr:first-child th", "cells => cells.map(c => c.textContent)")
    assert header == ["", *attention.col_labels]
    labels = page.eval_on_selector_all("#matrix tr[data-row] th", "cells => cells.map(c => c.textContent)")
    assert labels == attention.row_labels
    numbers = page.eval_on_selector_all("#matrix tr[data-row]", "rows => rows.map(r => [...r.querySelectorAll('td')]"
                                        ".map(c => c.textContent))")
    assert numbers == [[f"{w:.2f}" for w in row] for row in attention.weights]
    assert "0" in page.inner_text("#legend") and page.is_visible("#legend .legend-bar")


def test_layer_and_heads_reach_the_server(page, demo):
    url, client = demo
    translated(page, url)
    info = client.get_model(TINY_MODEL_NAME)
    layers = page.eval_on_selector_all("#layer option", "o => o.map(x => x.value)")
    assert layers == ["", *map(str, range(info.attention_layers))]
    assert page.locator("#heads input[type=checkbox]").count() == info.attention_heads
    with page.expect_response(lambda r: "/api/generate" in r.url) as answered:
        page.select_option("#layer", "0")
    assert "layer=0" in answered.value.url
    page.wait_for_function("() => document.getElementById('reduction').textContent.startsWith('layer 0 of')")
    with page.expect_response(lambda r: "/api/generate" in r.url and "heads=1" in r.url):
        page.check('#heads input[value="1"]')
    page.wait_for_function("() => document.getElementById('reduction').textContent.includes('head 1,')")
    expected = client.generate(translation_request(TEXT, "en", True, "words", layer=0, heads=(1,),
                                                   model=TINY_MODEL_NAME)).attention
    assert page.inner_text("#reduction") == expected.reduction
    page.hover('#output span[data-row="0"]')
    np.testing.assert_allclose(weights(page, "#source span"), expected.weights[0], atol=1e-4)


def test_the_translators_side_by_side(page, demo, shots):
    url, client = demo
    translated(page, url)
    page.click("#compare")
    page.wait_for_selector("#compare-view .panel .panel-output")
    panels = page.eval_on_selector_all("#compare-view .panel", "ps => ps.map(p => [p.dataset.model, "
                                       "p.querySelector('.panel-output').textContent])")
    expected = [(m, client.generate(translation_request(TEXT, "", True, "words", model=m)).text)
                for m in (TINY_RECURRENT_NAME, TINY_MODEL_NAME)]
    assert sorted(map(tuple, panels)) == sorted(expected)
    assert page.locator("#compare-view .panel table tr[data-row]").count() > 0
    boxes = [page.locator(f'#compare-view .panel[data-model="{m}"]').bounding_box() for m, _ in expected]
    assert abs(boxes[0]["y"] - boxes[1]["y"]) < 1 and boxes[0]["x"] != boxes[1]["x"]  # side by side
    page.screenshot(path=str(shots / "lecture-compare.png"), full_page=True)


def test_audio_has_a_time_axis(page, demo, tmp_path, shots):
    url, _ = demo
    t = np.arange(24000) / 16000
    (tmp_path / "clip.wav").write_bytes(wav_bytes(0.3 * np.sin(2 * np.pi * (200 + 900 * t) * t), 16000, "pcm16"))
    page.goto(url)
    page.wait_for_selector("body[data-ready=true]")
    page.select_option("#model", TINY_SPEECH_NAME)
    page.set_input_files("#audio-file", str(tmp_path / "clip.wav"))
    page.wait_for_selector("#output span")
    ticks = page.eval_on_selector_all("#time-axis .tick", "ts => ts.map(t => [t.textContent, t.style.left])")
    assert [label for label, _ in ticks] == ["0 s", "0.2 s", "0.4 s", "0.6 s", "0.8 s", "1 s", "1.2 s", "1.4 s"]
    lefts = [float(left.rstrip("%")) for _, left in ticks]
    assert lefts[0] == 0 and all(b > a for a, b in zip(lefts, lefts[1:])) and lefts[-1] <= 100
    axis, line = page.locator("#time-axis").bounding_box(), page.locator("#timeline").bounding_box()
    assert abs(axis["width"] - line["width"]) < 5 and axis["y"] >= line["y"] + line["height"] - 1
    page.screenshot(path=str(shots / "lecture-audio.png"), full_page=True)


def test_samples_for_each_kind_and_a_large_picture(page, demo):
    url, _ = demo
    page.goto(url)
    page.wait_for_selector("body[data-ready=true]")
    options = page.eval_on_selector_all("#samples option", "o => o.map(x => x.value)")
    texts = json.loads((SAMPLES / "text.json").read_text())
    assert options[1:] == texts["zh"] + texts["en"]
    with page.expect_response(lambda r: "/api/generate" in r.url):
        page.select_option("#samples", texts["zh"][1])
    page.wait_for_selector("#output span")
    assert page.input_value("#text") == texts["zh"][1]
    scenes = json.loads((SAMPLES / "scenes.json").read_text())
    assert all((SAMPLES / s["file"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for s in scenes) and len(scenes) >= 4
    # The CSS shows an image at up to 32rem (640 px), however small the upload.
    width = page.evaluate("""() => { const i = document.getElementById('image'); i.src = '/static/samples/scene-1.png';
        document.getElementById('picture').hidden = false; document.getElementById('result').hidden = false;
        return new Promise(ok => i.onload = () => ok(i.getBoundingClientRect().width)); }""")
    assert width >= 480


def test_save_as_png_and_link_to_the_view(page, demo, browser, tmp_path):
    url, client = demo
    translated(page, url)
    page.select_option("#layer", "0")
    page.wait_for_function("() => document.getElementById('reduction').textContent.startsWith('layer 0 of')")
    with page.expect_download() as saved:
        page.click("#export")
    path = tmp_path / "view.png"
    saved.value.save_as(path)
    data = path.read_bytes()
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    rows = client.generate(translation_request(TEXT, "en", True, "words", model=TINY_MODEL_NAME)).attention
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and width >= 64 * len(rows.col_labels) and height >= 40 * len(rows.row_labels)
    shutil.copy(path, tmp_path / "kept.png")
    page.click("#permalink")
    link = page.input_value("#link")
    assert link.startswith(url) and "model=" + TINY_MODEL_NAME in link and "layer=0" in link
    other = browser.new_page()
    other.set_default_timeout(MS)
    other.goto(link)
    other.wait_for_selector("#output span")
    assert other.input_value("#text") == TEXT and other.input_value("#layer") == "0"
    assert other.inner_text("#output") == page.inner_text("#output")
    assert other.inner_text("#reduction") == page.inner_text("#reduction")
    other.close()


@pytest.mark.bundled
def test_the_bundled_translators_in_a_lecture(browser, tmp_path, shots):
    """Both bundled translators: a lecture sentence, a word pinned from the keyboard, then side by side."""
    from attnserve.server.edge import app

    bundled = pathlib.Path(__file__).resolve().parents[1] / "models"
    repo = tmp_path / "models"
    repo.mkdir()
    for name in ("translate-zh-en", "translate-zh-en-rnn"):
        (repo / name).symlink_to(bundled / name)
    text = "注意力機制讓模型知道該看哪裡。"
    with gateway_thread.demo(repo) as (url, client):
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        page.set_default_timeout(MS)
        page.goto(url)
        page.wait_for_selector("body[data-ready=true]")
        assert page.input_value("#model") == "translate-zh-en"  # the Transformer, the lecture's main model
        page.fill("#text", text)
        page.click("#translate")
        page.wait_for_selector("#output span")
        expected = client.generate(translation_request(text, "", True, "words", model="translate-zh-en"))
        assert page.inner_text("#output").split() == expected.attention.row_labels
        page.focus('#output span[data-row="0"]')
        page.keyboard.press("ArrowRight")
        np.testing.assert_allclose(weights(page, "#source span"), expected.attention.weights[1], atol=1e-4)
        page.screenshot(path=str(shots / "bundled-translator.png"), full_page=True)
        # The model's glossary: the lecture's term is written as the lecturer wants it.
        assert "attention mechanism" not in page.inner_text("#output")
        page.check("#glossary")
        page.click("#translate")
        page.wait_for_function("() => document.getElementById('status').textContent.includes('glossary')")
        assert page.inner_text("#status").endswith(", 1 of 1 glossary terms placed")
        assert "attention mechanism" in " ".join(page.inner_text("#output").split())
        # The words that spell the term are outlined as a glossary term, and only they.
        terms = page.eval_on_selector_all("#output span.term", "spans => spans.map(s => s.textContent)")
        assert terms == ["attention", "mechanism"]
        page.screenshot(path=str(shots / "bundled-glossary.png"), full_page=True)
        page.click("#compare")
        page.wait_for_selector('#compare-view .panel[data-model="translate-zh-en-rnn"] .panel-output')
        page.locator("#compare-view").scroll_into_view_if_needed()
        page.screenshot(path=str(shots / "bundled-compare.png"), full_page=True)
        page.close()


def test_cors_from_another_origin_in_the_browser(browser, demo):
    """A page of one origin (http://localhost:P, a gateway's own page) calls another gateway's API
    (http://127.0.0.1:Q) with a JSON POST: Chromium's real preflight passes when the origin is listed and
    the call is blocked when it is not."""
    from attnserve.clients.web.http_options import HttpOptions
    from gateway_thread import BackgroundGateway

    _, client = demo
    with BackgroundGateway(client.address) as home:
        origin = home.url.replace("127.0.0.1", "localhost")
        with BackgroundGateway(client.address, HttpOptions(frozenset({origin}))) as allowing, \
                BackgroundGateway(client.address, HttpOptions(frozenset({"https://elsewhere.example"}))) as refusing:
            page = browser.new_page()
            page.set_default_timeout(MS)
            page.goto(origin + "/")
            call = """async (url) => {
                try {
                    const r = await fetch(url + '/v1/generate', {method: 'POST', headers: {'Content-Type':
                        'application/json'}, body: JSON.stringify({model: '%s', text: {text: '%s'}})});
                    return [r.status, (await r.json()).text];
                } catch (e) { return ['blocked', String(e)]; }
            }""" % (TINY_MODEL_NAME, TEXT)
            status, text = page.evaluate(call, allowing.url)
            assert status == 200 and text == client.generate(translation_request(TEXT, model=TINY_MODEL_NAME)).text
            assert page.evaluate(call, refusing.url)[0] == "blocked"
            page.close()


def test_opens_on_the_translator_though_another_model_sorts_first(browser, tiny_model_repo, tiny_speech_repo):
    with gateway_thread.demo(tiny_speech_repo, tiny_model_repo) as (url, client):
        assert [m.name for m in client.list_models()][0] == TINY_SPEECH_NAME
        page = browser.new_page()
        page.set_default_timeout(MS)
        page.goto(url)
        page.wait_for_selector("body[data-ready=true]")
        assert page.input_value("#model") == TINY_MODEL_NAME and page.is_visible("#text-input")
        page.close()
