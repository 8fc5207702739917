"""The gateway's HTTP/JSON API (/v1/) against real tiny models: served over HTTP == served over gRPC, every
answer valid against the committed OpenAPI document, streams == unary, CORS, bearer tokens and HTTPS."""

from __future__ import annotations

import base64
import dataclasses
import json
import ssl
import urllib.error
import urllib.request

import pytest

pytest.importorskip("aiohttp", reason="the web gateway needs the `web` extra (aiohttp)")
jsonschema = pytest.importorskip("jsonschema", reason="validating answers needs jsonschema (the `dev` extra)")

from attnserve.clients.client import audio_request, translation_request  # noqa: E402
from attnserve.clients.web import openapi  # noqa: E402
from attnserve.clients.web.http_options import HttpOptions  # noqa: E402
from attnserve.api import convert  # noqa: E402
from attnserve.api.generation import DecodingOptions  # noqa: E402
from conftest import TINY_MODEL_NAME, TINY_SPEECH_NAME  # noqa: E402
from fakes import WAIT  # noqa: E402
from google.protobuf import json_format  # noqa: E402
from test_client_resilience import certificate  # noqa: E402, F401  (the fixture)
from test_web import clip  # noqa: E402

import gateway_thread  # noqa: E402

TEXT = "知識就是力量。"
DOCUMENT = json.loads(openapi.DOCUMENT.read_text(encoding="utf-8"))
ORIGIN = "https://lecture.example.org"


@pytest.fixture(scope="module")
def demo(tiny_model_repo, tiny_speech_repo):
    """(gateway url, client): both tiny models behind a gateway that lets ORIGIN call it."""
    with gateway_thread.demo(tiny_model_repo, tiny_speech_repo, http=HttpOptions({ORIGIN})) as served:
        yield served


def call(url, body=None, headers=(), method=None, context=None):
    """(status, headers, body bytes) of one HTTP call; `body` a dict is sent as JSON."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json", **dict(headers)})
    try:
        with urllib.request.urlopen(request, timeout=WAIT, context=context) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def valid(body, schema: str):
    """`body` after checking it against the document's schema `schema` (raises ValidationError)."""
    jsonschema.Draft202012Validator(
        {"$ref": f"#/components/schemas/{schema}", "components": DOCUMENT["components"]},
        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER,
    ).validate(body)
    return body


def wire(result) -> dict:
    """What the API should answer for a result the gRPC client got."""
    message = convert.result_to_proto(result)
    return json_format.MessageToDict(message, always_print_fields_with_no_presence=True)


def test_the_committed_document_is_current_and_valid():
    from openapi_spec_validator import validate

    pytest.importorskip("grpc_tools", reason="regenerating the document needs grpcio-tools")
    assert openapi.build(openapi.descriptor_set()) == DOCUMENT, "run python -m attnserve.clients.web.openapi"
    validate(DOCUMENT)
    request = DOCUMENT["components"]["schemas"]["DecodingOptions"]["properties"]["beamSize"]
    assert request["type"] == "integer" and "default_beam_size" in request["description"]


def test_the_document_is_served(demo):
    url, _ = demo
    status, _, body = call(url + "/v1/openapi.json")
    assert status == 200 and json.loads(body) == DOCUMENT


def test_models_as_over_grpc(demo):
    url, client = demo
    status, _, body = call(url + "/v1/models")
    models = valid(json.loads(body), "ListModelsResponse")["models"]
    assert status == 200 and [m["name"] for m in models] == [m.name for m in client.list_models()]
    assert models[0]["maxRequestBytes"] == str(client.list_models()[0].max_request_bytes)  # int64 as a string
    status, _, body = call(f"{url}/v1/models/{TINY_MODEL_NAME}")
    assert status == 200 and valid(json.loads(body), "ModelInfo") == models[1]


def test_every_option_reaches_the_server(demo):
    url, client = demo
    body = {"model": TINY_MODEL_NAME, "text": {"text": TEXT}, "targetLanguage": "en",
            "decoding": {"beamSize": 3, "numReturnSequences": 2, "maxNewTokens": 6, "noRepeatNgramSize": 2},
            "attention": {"mode": "ATTENTION_MODE_AGGREGATED", "layer": 0, "heads": [1, -1],
                          "granularity": "ATTENTION_GRANULARITY_PIECES", "reduction": "ATTENTION_REDUCTION_MAX"}}
    status, _, answer = call(url + "/v1/generate", body)
    assert status == 200, answer
    got = valid(json.loads(answer), "GenerateResponse")
    request = translation_request(TEXT, "en", True, "pieces", layer=0, heads=(1, -1), reduction="max",
                                  model=TINY_MODEL_NAME)
    decoding = DecodingOptions(max_new_tokens=6, beam_size=3, num_return_sequences=2, no_repeat_ngram_size=2)
    expected = client.generate(dataclasses.replace(request, decoding=decoding))
    want = wire(expected)
    assert len(got["nbest"]) == 2 and got["attention"]["reduction"] == want["attention"]["reduction"]
    got.pop("timings"), want.pop("timings")
    assert got == want


def test_audio_as_base64(demo):
    url, client = demo
    body = {"model": TINY_SPEECH_NAME, "audio": {"data": base64.b64encode(clip()).decode()},
            "attention": {"mode": "ATTENTION_MODE_AGGREGATED", "granularity": "ATTENTION_GRANULARITY_WORDS"}}
    status, _, answer = call(url + "/v1/generate", body)
    got = valid(json.loads(answer), "GenerateResponse")
    expected = client.generate(audio_request(clip(), model=TINY_SPEECH_NAME, attention=True, granularity="words"))
    assert status == 200 and got["text"] == expected.text and got["words"] == wire(expected)["words"]


@pytest.mark.parametrize("accept", ["text/event-stream", "application/x-ndjson"])
def test_a_stream_ends_with_the_unary_answer(demo, accept):
    url, _ = demo
    body = {"model": TINY_MODEL_NAME, "text": {"text": TEXT}, "targetLanguage": "en", "decoding": {"beamSize": 1},
            "attention": {"mode": "ATTENTION_MODE_AGGREGATED"}}
    status, headers, answer = call(url + "/v1/generate/stream", body, {"Accept": accept})
    assert status == 200 and headers.get_content_type() == accept
    if accept == "text/event-stream":
        events = [json.loads(line[len("data: "):]) for line in answer.decode().split("\n\n") if line]
    else:
        events = [json.loads(line) for line in answer.decode().splitlines()]
    for event in events:
        valid(event, "GenerateStreamResponse")
    *tokens, final = events
    _, _, unary = call(url + "/v1/generate", body)
    unary = json.loads(unary)
    assert final["response"]["text"] == unary["text"] and final["response"]["tokens"] == unary["tokens"]
    assert "".join(t["token"]["text"] for t in tokens) == unary["text"]
    assert [t["token"]["index"] for t in tokens] == list(range(len(unary["tokens"])))


@pytest.mark.parametrize(
    "path, body, status, code, message",
    [
        ("/v1/generate", b"{", 400, "INVALID_ARGUMENT", "not a valid GenerateRequest"),
        ("/v1/generate", {"model": TINY_MODEL_NAME, "text": {"text": TEXT}, "beam": 2}, 400, "INVALID_ARGUMENT",
         "beam"),
        ("/v1/generate", {"model": "nope", "text": {"text": TEXT}}, 404, "NOT_FOUND", "unknown model 'nope'"),
        ("/v1/generate", {"model": TINY_MODEL_NAME, "text": {"text": TEXT}, "decoding": {"beamSize": 99}}, 400,
         "INVALID_ARGUMENT", "beam_size 99"),
        ("/v1/generate/stream", {"model": TINY_MODEL_NAME, "text": {"text": ""}}, 400, "INVALID_ARGUMENT", "empty"),
        ("/v1/models/nope", None, 404, "NOT_FOUND", "nope"),
    ],
    ids=["bad-json", "unknown-field", "unknown-model", "beam-too-large", "stream-empty-text", "get-unknown"],
)
def test_errors_name_the_problem(demo, path, body, status, code, message):
    url, _ = demo
    answered, _, answer = call(url + path, body)
    error = valid(json.loads(answer), "Error")["error"]
    assert (answered, error["code"]) == (status, code) and message in error["message"], error


def test_cors_lets_only_listed_origins_in(demo):
    url, _ = demo
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type, authorization"}
    status, headers, _ = call(url + "/v1/generate", headers=preflight, method="OPTIONS")
    assert status == 204 and headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "POST" in headers["Access-Control-Allow-Methods"]
    assert "authorization" in headers["Access-Control-Allow-Headers"]
    status, headers, _ = call(url + "/v1/models", headers={"Origin": ORIGIN})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == ORIGIN and "Origin" in headers["Vary"]
    other = {**preflight, "Origin": "https://elsewhere.example.com"}
    status, headers, _ = call(url + "/v1/generate", headers=other, method="OPTIONS")
    assert status == 403 and "Access-Control-Allow-Origin" not in headers
    status, headers, _ = call(url + "/v1/models", headers={"Origin": other["Origin"]})
    assert "Access-Control-Allow-Origin" not in headers


def test_without_an_allow_list_there_is_no_cors(tiny_model_repo):
    with gateway_thread.demo(tiny_model_repo) as (url, _):
        status, headers, _ = call(url + "/v1/generate", method="OPTIONS",
                                  headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"})
    assert status == 405 and "Access-Control-Allow-Origin" not in headers


def test_tokens_and_https(tiny_model_repo, certificate):  # noqa: F811
    cert, key = certificate
    http = HttpOptions(frozenset({ORIGIN}), frozenset({"s3cret", "next"}), cert, key)
    trust = ssl.create_default_context(cafile=cert)
    with gateway_thread.demo(tiny_model_repo, http=http) as (url, _):
        assert url.startswith("https://")
        for headers, status in (({}, 401), ({"Authorization": "Bearer wrong"}, 401),
                                ({"Authorization": "Basic s3cret"}, 401), ({"Authorization": "Bearer s3cret"}, 200),
                                ({"Authorization": "bearer next"}, 200)):
            answered, answer_headers, _ = call(url + "/v1/models", headers=headers, context=trust)
            assert answered == status, headers
        assert answer_headers.get("WWW-Authenticate") is None
        answered, headers, _ = call(url + "/api/models", context=trust)
        assert answered == 401 and headers["WWW-Authenticate"].startswith("Bearer")
        # The document, the page and preflights stay open.
        assert call(url + "/v1/openapi.json", context=trust)[0] == 200
        assert call(url + "/", context=trust)[0] == 200
        preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "GET"}
        assert call(url + "/v1/models", headers=preflight, method="OPTIONS", context=trust)[0] == 204
        with pytest.raises(OSError):  # plain HTTP to the TLS port: refused or cut off
            call(url.replace("https://", "http://") + "/v1/openapi.json")


def test_an_image_as_base64(tmp_path_factory):
    import tiny_image
    from attnserve.clients.client import image_request

    repo = tiny_image.export_repo(tiny_image.captioner(seed=1), tmp_path_factory.mktemp("image_repo"))
    picture = tiny_image.encode(tiny_image.pixels(40, 56, seed=2))
    with gateway_thread.demo(repo) as (url, client):
        body = {"model": tiny_image.NAME, "image": {"data": base64.b64encode(picture).decode()},
                "attention": {"mode": "ATTENTION_MODE_AGGREGATED"}}
        status, _, answer = call(url + "/v1/generate", body)
        expected = client.generate(image_request(picture, model=tiny_image.NAME, attention=True, granularity="pieces"))
    got = valid(json.loads(answer), "GenerateResponse")
    want = wire(expected)
    assert status == 200 and got["text"] == want["text"] and got["sourceTokens"] == want["sourceTokens"]
    assert got["attention"] == want["attention"]
