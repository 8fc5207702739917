"""The serving install works without the export stack, and the package builds and serves from its sdist."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tarfile
import tomllib
import zipfile

import pytest
from grpc_health.v1 import health_pb2

from conftest import TINY_MODEL_NAME
from served_process import served

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_serving_dependencies_do_not_pull_torch():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    serving = project["dependencies"] + project["optional-dependencies"]["cpu"]
    assert not [d for d in serving if d.split("=")[0].strip().lower() in {"torch", "onnx", "onnxscript"}]
    # Everything CI installs is pinned exactly (an unpinned torch would pull a multi-GB CUDA build).
    for extra in ("cpu", "gpu", "export", "dev"):
        for dep in project["optional-dependencies"][extra] + project["dependencies"]:
            if dep.startswith("attnserve["):  # another extra of this package, pinned where it is defined
                continue
            assert "==" in dep, f"{dep} is not pinned"


def test_server_and_clients_run_with_torch_and_onnx_unimportable(tiny_model_repo):
    script = f"""
import sys
sys.modules["torch"] = None  # any `import torch` now raises ImportError
sys.modules["onnx"] = None
import attnserve.server.edge.app, attnserve.clients.cli, attnserve.clients.client
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.registry import load_engines
from attnserve.api.generation import GenerationRequest, AttentionOptions
from attnserve.server.model.runtime import RuntimeOptions
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


# ---- the package as users get it: sdist -> wheel -> a fresh venv outside the checkout ---------------------


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    """A wheel built from the sdist alone (not from the checkout), checking the sdist carries the build."""
    out = tmp_path_factory.mktemp("dist")
    # Isolation off: the build requirements (setuptools, grpcio-tools) are pinned in the dev extra too.
    build = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out)]
    _run([*build, "--sdist", str(ROOT)])
    (sdist,) = out.glob("attnserve-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
        archive.extractall(out / "unpacked", filter="data")
    assert not [n for n in names if "_pb2" in n], "generated stubs leaked into the sdist"
    (source,) = (out / "unpacked").iterdir()
    _run([*build, "--wheel", str(source)])
    # Stubs go to the build directory: the unpacked source tree stays as it was.
    assert not list((source / "protos").rglob("*_pb2*")), "the build wrote stubs into the source tree"
    (built,) = out.glob("attnserve-*.whl")
    return built


def test_the_wheel_holds_every_package_and_the_stubs(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    for module in ("attnserve/v1/attnserve_pb2.py", "attnserve/v1/attnserve_pb2_grpc.py", "attnserve/v1/attnserve.proto"):
        assert module in names
    # Every package folder of the checkout is in the wheel (a missing one imports in an editable install only).
    folders = {"server": "attnserve/server", "clients": "attnserve/clients", "export": "attnserve/export",
               "protos/attnserve/api": "attnserve/api"}
    for folder, package in folders.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.relative_to(ROOT / folder).as_posix()
            assert f"{package}/{relative}" in names, f"{folder}/{relative} is missing from the wheel"
    # The page's files, its samples and the HTTP API's document, which the gateway serves from the package.
    web = ROOT / "clients" / "web"
    for path in [*(web / "static").rglob("*.*"), web / "openapi.json"]:
        assert f"attnserve/clients/web/{path.relative_to(web).as_posix()}" in names, f"{path} is missing"


def test_the_installed_wheel_serves_from_outside_the_checkout(wheel, tmp_path, tiny_model_repo):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    _run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", f"{wheel}[cpu]"], timeout=600)
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    # The installed modules, not the checkout's, and the packages an editable install hid.
    where = _run([str(venv / "bin" / "python"), "-c", _WHERE], cwd=tmp_path, env=env).stdout
    assert str(ROOT) not in where and where.count(str(venv)) == 3, where
    attnserve = str(venv / "bin" / "attnserve")
    with served([attnserve], str(tiny_model_repo), cwd=str(tmp_path), env=env) as server:
        assert server.health() == health_pb2.HealthCheckResponse.SERVING
        translate = [attnserve, "translate", "Knowledge is power.", "--to", "zh-TW", "--model", TINY_MODEL_NAME]
        answer = _run([*translate, "--max-tokens", "3", "--json", "--address", server.address], cwd=tmp_path, env=env)
        assert 1 <= len(json.loads(answer.stdout)["tokens"]) <= 3
        assert server.stop() == 0


_WHERE = """
import attnserve.server.edge.app, attnserve.v1.attnserve_pb2, attnserve.export.translation.corpus
for module in (attnserve.server.edge.app, attnserve.v1.attnserve_pb2, attnserve.export.translation.corpus):
    print(module.__file__)
"""


def _run(command: list[str], timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done
