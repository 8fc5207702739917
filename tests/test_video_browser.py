"""The demo page in headless Chromium with a clip: upload a WebM file to the tiny video model, point at a word,
see its timeline over the sampled frames and its most-attended frame's heatmap (as tests/test_web_browser.py
does for the other kinds; skipped without Playwright or Chromium)."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

pytest.importorskip("aiohttp", reason="the web gateway needs the `web` extra (aiohttp)")
pytest.importorskip("av")
sync_api = pytest.importorskip("playwright.sync_api", reason="the browser tests need Playwright (the `dev` extra)")

from attnserve.export.video.render import encode_video  # noqa: E402
from attnserve.server.edge import app  # noqa: E402
from attnserve.api.generation import (  # noqa: E402
    AttentionGranularity,
    AttentionOptions,
    GenerationRequest,
    VideoInput,
)
from fakes import WAIT  # noqa: E402
from gateway_thread import BackgroundGateway  # noqa: E402
from tiny_video import NAME, frames, video_model, video_repo  # noqa: E402, F401 (fixtures)

CHROMIUM = os.environ.get("ATTNSERVE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.skipif(CHROMIUM is None, reason="no Chromium executable: apt-get install chromium"),
              pytest.mark.usefixtures("torch_one_thread")]


def test_upload_a_clip_and_point_at_its_words(video_repo, tmp_path):
    clip = encode_video(frames(12, 32, 48, seed=0), 10, "webm")
    path = tmp_path / "clip.webm"
    path.write_bytes(clip)
    engines = app.load_engines(app.ServeOptions(models=str(video_repo)))
    options = AttentionOptions(enabled=True, granularity=AttentionGranularity.WORDS)
    with app.BackgroundServer(engines) as server, BackgroundGateway(server.address) as web, \
            sync_api.sync_playwright() as playwright:
        expected = engines[NAME].generate(GenerationRequest(NAME, video=VideoInput(clip), attention=options), WAIT)
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page(viewport={"width": 1000, "height": 900})
        page.set_default_timeout(WAIT * 1000)
        page.goto(web.url)
        page.wait_for_selector("body[data-ready=true]")
        page.select_option("#model", NAME)
        assert page.is_visible("#video-input") and page.is_hidden("#image-input")
        page.set_input_files("#video-file", str(path))
        page.wait_for_selector("#output span")
        assert page.inner_text("#output").split() == expected.text.split() and page.is_visible("#clip")
        last = len(expected.frames) - 1
        page.hover(f'#output span[data-row="{last}"]')
        frame = expected.frames[last]
        heights = page.eval_on_selector_all("#frame-bars div", "bars => bars.map(b => parseFloat(b.style.height))")
        np.testing.assert_allclose(heights, np.array(frame.timeline) / max(frame.timeline) * 100, atol=0.1)
        cells = page.eval_on_selector_all("#frame-cells .column", "cells => cells.map(c => +c.dataset.weight)")
        np.testing.assert_allclose(cells, frame.heatmap, atol=1e-4)
        label = page.inner_text("#frame-label")
        assert label.startswith(f"{frame.word}: frame {frame.peak_frame + 1} of 4")
        assert f"({frame.frame_seconds[frame.peak_frame]:.2f} s)" in label
        browser.close()
