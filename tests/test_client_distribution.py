"""The client distribution (clients/standalone/): its wheel holds the client and none of the serving core, and
installed alone in a fresh venv, beside grpcio and protobuf only, it calls a real server."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import tomllib
import zipfile

import pytest

from conftest import TINY_MODEL_NAME

ROOT = pathlib.Path(__file__).resolve().parents[1]
STANDALONE = ROOT / "clients" / "standalone"
# What a client install must not pull: the serving core's dependencies, and the server distribution itself.
SERVER_ONLY = {"attnserve", "numpy", "onnxruntime", "onnxruntime-gpu", "torch", "tokenizers", "pillow",
               "prometheus-client", "grpcio-health-checking", "grpcio-reflection", "matplotlib"}


def _server_pins() -> dict[str, str]:
    """The server distribution's exact pins, by name."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return dict(d.split("==") for d in dependencies)


@pytest.fixture(scope="module")
def client_wheel(tmp_path_factory) -> pathlib.Path:
    """The client wheel, built from the client sdist (which must therefore carry its sources)."""
    out = tmp_path_factory.mktemp("client_dist")
    # Isolation off, as in test_packaging: the build requirements are pinned in the dev extra.
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(STANDALONE)])
    (wheel,) = out.glob("attnserve_client-*.whl")
    return wheel


def test_the_wheel_holds_the_client_and_nothing_of_the_serving_core(client_wheel):
    with zipfile.ZipFile(client_wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        scripts = archive.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
        shared = {name: archive.read(name) for name in names if name.endswith(".py") and "_pb2" not in name}
    modules = {name for name in names if not name.startswith("attnserve_client-")}
    clients = {f"attnserve/clients/{p.name}" for p in (ROOT / "clients").glob("*.py")}
    contract = {f"attnserve/api/{p.name}" for p in (ROOT / "protos/attnserve/api").glob("*.py")}
    stubs = {f"attnserve/v1/{name}" for name in ("__init__.py", "attnserve.proto", "attnserve_pb2.py",
                                                 "attnserve_pb2.pyi", "attnserve_pb2_grpc.py")}
    assert modules == clients | contract | stubs  # no clients/web/, no attnserve/__init__.py, no server at all
    # The same bytes the server's wheel installs at these paths, so both distributions can be installed.
    for name, data in shared.items():
        folder = {"clients": "clients", "api": "protos/attnserve/api", "v1": "protos/attnserve/v1"}[name.split("/")[1]]
        assert data == (ROOT / folder / name.split("/")[-1]).read_bytes(), name
    server_version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert f"\nVersion: {server_version}\n" in metadata
    pins = _server_pins()
    requires = sorted(line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Requires-Dist:"))
    assert requires == [f"grpcio<2,>={pins['grpcio']}", 'matplotlib<4,>=3.11.2; extra == "plot"',
                        f"protobuf<8,>={pins['protobuf']}"]
    assert scripts.split() == ["[console_scripts]", "attnserve-client", "=", "attnserve.clients.cli:client_main"]


def test_the_client_alone_calls_a_server(client_wheel, tmp_path, tiny_server):
    background, _ = tiny_server
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    # The wheel's own dependencies, held at the server's pins (the versions the tests run with).
    pins = _server_pins()
    install = [str(client_wheel), f"grpcio=={pins['grpcio']}", f"protobuf=={pins['protobuf']}"]
    _run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", *install], timeout=300)
    listed = _run([str(venv / "bin" / "pip"), "list", "--format=json", "--disable-pip-version-check"]).stdout
    installed = {package["name"].lower().replace("_", "-") for package in json.loads(listed)}
    assert not installed & SERVER_ONLY, installed
    assert {"attnserve-client", "grpcio", "protobuf"} <= installed

    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    script = _CALLS.format(address=background.address, model=TINY_MODEL_NAME)
    answer = json.loads(_run([str(venv / "bin" / "python"), "-c", script], cwd=tmp_path, env=env).stdout)
    assert str(venv) in answer["client"] and str(ROOT) not in answer["client"]
    assert TINY_MODEL_NAME in answer["models"] and answer["health"] == "SERVING"
    rows, columns, row_width = answer["attention"]
    assert answer["tokens"] > 0 and rows > 0 and columns == row_width > 0 and answer["async_tokens"] > 0
    assert answer["loaded"] == []  # nothing of numpy, ONNX Runtime or the serving core was imported

    cli = str(venv / "bin" / "attnserve-client")
    usage = _run([cli, "--help"], cwd=tmp_path, env=env).stdout
    commands = re.findall(r"^    (\w+)", usage, re.MULTILINE)
    assert commands == ["translate", "compare", "transcribe", "caption", "models", "health"]  # no serve, no web
    # A PNG needs the `plot` extra: a clear message, not a traceback.
    translate = [cli, "translate", "知識就是力量。", "--to", "en", "--model", TINY_MODEL_NAME]
    png = subprocess.run([*translate, "--attention", "out.png", "--address", background.address], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=60)
    assert png.returncode == 1 and "attnserve-client[plot]" in png.stderr and "Traceback" not in png.stderr


def test_the_health_check_matches_the_health_protocol_without_its_stubs():
    from google.protobuf import wrappers_pb2
    from grpc_health.v1 import health_pb2

    from attnserve.clients import client

    request = health_pb2.HealthCheckRequest(service="attnserve.v1.AttnServe")
    assert request.SerializeToString() == wrappers_pb2.StringValue(value=request.service).SerializeToString()
    for name, value in health_pb2.HealthCheckResponse.ServingStatus.items():
        wire = health_pb2.HealthCheckResponse(status=value).SerializeToString()
        assert client._SERVING_STATUS[wrappers_pb2.Int32Value.FromString(wire).value] == name


_CALLS = """
import asyncio, json, sys
from attnserve.clients.client import AsyncClient, Client

with Client("{address}", timeout=30) as client:
    models = [info.name for info in client.list_models()]
    result = client.translate("知識就是力量。", to="en", model="{model}", attention=True, max_new_tokens=5)
    health = client.health()["{address}"]

async def call_async():
    async with AsyncClient("{address}", timeout=30) as client:
        return await client.translate("Knowledge is power.", to="zh-TW", model="{model}", max_new_tokens=3)

heavy = ("numpy", "onnxruntime", "torch", "tokenizers", "attnserve.server", "grpc_health")
print(json.dumps({{
    "client": sys.modules["attnserve.clients.client"].__file__,
    "models": models,
    "health": health,
    "tokens": len(result.tokens),
    "attention": [len(result.attention.weights), len(result.attention.col_labels), len(result.attention.weights[0])],
    "async_tokens": len(asyncio.run(call_async()).tokens),
    "loaded": sorted(name for name in heavy if name in sys.modules),
}}))
"""


def _run(command: list[str], timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done
