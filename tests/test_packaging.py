"""The serving install works without the export stack (torch, onnx)."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_serving_dependencies_do_not_pull_torch():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    serving = project["dependencies"] + project["optional-dependencies"]["cpu"]
    assert not [d for d in serving if d.split("=")[0].strip().lower() in {"torch", "onnx", "onnxscript"}]
    # Everything CI installs is pinned exactly (an unpinned torch would pull a multi-GB CUDA build).
    for extra in ("cpu", "gpu", "export", "dev"):
        for dep in project["optional-dependencies"][extra] + project["dependencies"]:
            assert "==" in dep, f"{dep} is not pinned"


def test_server_and_clients_run_with_torch_and_onnx_unimportable(tiny_model_repo):
    script = f"""
import sys
sys.modules["torch"] = None  # any `import torch` now raises ImportError
sys.modules["onnx"] = None
import attnserve.server.app, attnserve.clients.cli, attnserve.clients.client
from attnserve.server.batcher import BatchingOptions
from attnserve.server.engine import load_engines
from attnserve.server.generation import GenerationRequest, AttentionOptions
from attnserve.server.runtime import RuntimeOptions
engines = load_engines({str(tiny_model_repo)!r}, RuntimeOptions(), BatchingOptions())
result = engines.get("tiny-translate").generate(GenerationRequest("tiny-translate", "知識就是力量。", "en",
                                                attention=AttentionOptions(enabled=True)))
engines.close()
assert result.attention is not None and len(result.tokens) > 0
print("ok", len(result.tokens))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok")
