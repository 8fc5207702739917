"""The TypeScript client (clients/js/) under Node against a live gateway and server on loopback.

Runs `npm ci && npm test` there: the build generates the client's types from clients/web/openapi.json and
compiles with tsc, then node:test calls the gateway and compares with what the Python gRPC client got for
the same requests (written to a JSON file the test reads). The same build then runs in headless Chromium. Skipped without node and npm (Node 20 or later).
`npm ci` installs the pinned devDependencies (typescript, @types/node) from the npm registry, or from the
npm cache when offline (`npm ci --offline` after one online run).
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import shutil
import subprocess

import pytest

pytest.importorskip("aiohttp", reason="the web gateway needs the `web` extra (aiohttp)")

from attnserve.clients.client import audio_request, translation_request  # noqa: E402
from attnserve.clients.web.http_options import HttpOptions  # noqa: E402
from conftest import TINY_MODEL_NAME, TINY_SPEECH_NAME  # noqa: E402
from test_web import clip  # noqa: E402

import gateway_thread  # noqa: E402

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "clients" / "js"
NODE, NPM = shutil.which("node"), shutil.which("npm")
pytestmark = pytest.mark.skipif(NODE is None or NPM is None, reason="node and npm are not installed")
TOKEN = "js-client-token"


def node_major() -> int:
    return int(subprocess.run([NODE, "--version"], capture_output=True, text=True).stdout.strip().lstrip("v").split(".")[0])


def expectations(client) -> dict:
    """What the Python gRPC client gets for the requests the Node tests send."""
    text, layer, heads = "知識就是力量。", 0, [0, -1]
    result = client.generate(translation_request(text, "en", True, "pieces", layer=layer, heads=heads,
                                                 model=TINY_MODEL_NAME))
    tokens = [{"piece": t.piece, "id": t.id, "logprob": t.logprob} for t in result.tokens]
    speech = client.generate(audio_request(clip(), model=TINY_SPEECH_NAME))
    return {
        "models": [m.name for m in client.list_models()],
        "text": {"model": TINY_MODEL_NAME, "text": text, "to": "en", "layer": layer, "heads": heads,
                 "response": {"text": result.text, "tokens": tokens}, "rows": result.attention.weights},
        "audio": {"model": TINY_SPEECH_NAME, "wav": base64.b64encode(clip()).decode(), "text": speech.text},
    }


def test_the_node_client_against_a_live_gateway(tiny_model_repo, tiny_speech_repo, tmp_path):
    if node_major() < 20:
        pytest.skip("the client needs Node 20 or later (fetch, web streams)")
    http = HttpOptions(tokens=frozenset({TOKEN}))
    with gateway_thread.demo(tiny_model_repo, tiny_speech_repo, http=http) as (url, client):
        expected = tmp_path / "expected.json"
        expected.write_text(json.dumps(expectations(client), ensure_ascii=False), encoding="utf-8")
        env = {**os.environ, "ATTNSERVE_URL": url, "ATTNSERVE_TOKEN": TOKEN, "ATTNSERVE_EXPECTED": str(expected)}
        install = subprocess.run([NPM, "ci", "--no-audit", "--no-fund"], cwd=PACKAGE, env=env, capture_output=True,
                                 text=True, timeout=300)
        if install.returncode != 0 and "ENOTFOUND" in install.stderr + install.stdout:
            pytest.skip("npm ci could not reach the registry (run it once online, then it uses npm's cache)")
        assert install.returncode == 0, install.stderr
        run = subprocess.run([NPM, "test"], cwd=PACKAGE, env=env, capture_output=True, text=True, timeout=300)
        report = run.stdout + run.stderr
        assert run.returncode == 0, report
        assert "# fail 0" in report and "# skipped 0" in report and "# pass 6" in report, report
        in_browser(url, json.loads(expected.read_text(encoding="utf-8")))


def in_browser(url: str, expected: dict) -> None:
    """The same build in headless Chromium: imported as a module by a page of the gateway, it translates and
    streams as under Node (skipped without Playwright or Chromium)."""
    try:
        from playwright.sync_api import sync_playwright
        from test_web_browser import CHROMIUM
    except ImportError:
        return
    if CHROMIUM is None:
        return
    module = (PACKAGE / "dist" / "src" / "index.js").read_text(encoding="utf-8")
    script = """async ([token, model, text]) => {
        const { AttnServeClient, translationRequest } = await import('/attnserve-client.js');
        const client = new AttnServeClient(location.origin, { token });
        const result = await client.translate(text, { model, to: 'en' });
        const events = [];
        for await (const event of client.stream(translationRequest(text, { model, to: 'en' }))) events.push(event);
        return [result.text, events.at(-1).response.text, events.length - 1, (await client.listModels()).length];
    }"""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page()
        page.route("**/attnserve-client.js", lambda route: route.fulfill(body=module, content_type="text/javascript"))
        page.goto(url + "/")
        text, streamed, tokens, models = page.evaluate(script, [TOKEN, expected["text"]["model"], expected["text"]["text"]])
        browser.close()
    assert text == streamed == expected["text"]["response"]["text"]
    assert tokens >= 1 and models == len(expected["models"])
