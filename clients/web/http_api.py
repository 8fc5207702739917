"""The HTTP/JSON API: the gRPC service's four calls over HTTP, in the proto3 JSON mapping.

    GET  /v1/models                 ListModels   -> ListModelsResponse
    GET  /v1/models/{name}          GetModel     -> ModelInfo
    POST /v1/generate               Generate     (body: GenerateRequest) -> GenerateResponse
    POST /v1/generate/stream        GenerateStream: Server-Sent Events, or JSON lines with
                                    `Accept: application/x-ndjson`; one GenerateStreamResponse per event
    GET  /v1/openapi.json           the OpenAPI document (clients/web/openapi.json)

Bodies are the messages as protobuf's JSON mapping writes them (field names in lowerCamelCase or as in the
.proto, 64-bit integers as strings, audio and image bytes as base64, enums by name), so a request carries
everything a gRPC GenerateRequest can: any input, every decoding and attention option. Answers write every
field without presence, defaults included, so a client need not know the proto's defaults. The request is
converted once to the serving core's dataclasses and sent through the gateway's AsyncClient (retries,
deadlines, round robin); a failure is {"error": {"code", "message"}} with the matching HTTP status. A stream
that fails after its first event ends with an error event (`event: error` / an {"error": ...} line).
docs/http-api.md has examples.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from aiohttp import web
from google.protobuf import json_format

from attnserve.clients.client import AsyncClient, AttnServeError
from attnserve.clients.web import payload
from attnserve.clients.web.errors import error_response
from attnserve.api import convert
from attnserve.api.generation import GenerationRequest, GenerationResult, StreamedToken
from attnserve.v1 import attnserve_pb2 as pb

OPENAPI = pathlib.Path(__file__).parent / "openapi.json"
NDJSON = "application/x-ndjson"
SSE = "text/event-stream"


class HttpApi:
    """The /v1/ routes, calling the gRPC server through the client stored in the app under `client_key`."""

    def __init__(self, client_key: web.AppKey):
        self._key = client_key

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_get("/v1/models", self.list_models)
        router.add_get("/v1/models/{name}", self.get_model)
        router.add_post("/v1/generate", self.generate)
        router.add_post("/v1/generate/stream", self.generate_stream)
        router.add_get("/v1/openapi.json", self.openapi)

    def _client(self, request: web.Request) -> AsyncClient:
        return request.app[self._key]

    async def list_models(self, request: web.Request) -> web.Response:
        infos = await self._client(request).list_models()
        return _message(pb.ListModelsResponse(models=[convert.model_info_to_proto(i) for i in infos]))

    async def get_model(self, request: web.Request) -> web.Response:
        info = await self._client(request).get_model(request.match_info["name"])
        return _message(convert.model_info_to_proto(info))

    async def generate(self, request: web.Request) -> web.Response:
        parsed = await _parse(request)
        if isinstance(parsed, web.Response):
            return parsed
        generation, source_language, _ = parsed
        result = await self._client(request).generate(generation, source_language)
        return _message(convert.result_to_proto(result))

    async def generate_stream(self, request: web.Request) -> web.StreamResponse:
        parsed = await _parse(request)
        if isinstance(parsed, web.Response):
            return parsed
        events = aiter(self._client(request).stream(*parsed))
        frame = _ndjson_frame if NDJSON in request.headers.get("Accept", "") else _sse_frame
        response = None
        try:
            # The first event is awaited before the answer starts, so a refused request gets its HTTP status.
            item = await anext(events)
            response = web.StreamResponse(headers={"Content-Type": NDJSON if frame is _ndjson_frame else SSE,
                                                   "Cache-Control": "no-cache"})
            await response.prepare(request)
            while True:
                await response.write(frame(_stream_message(item)))
                item = await anext(events)
        except StopAsyncIteration:
            pass
        except AttnServeError as exc:
            if response is None:
                raise
            await response.write(frame(payload.error_json(exc.code.name, exc.details), error=True))
        finally:
            await events.aclose()  # cancels the gRPC call when the caller went away
        await response.write_eof()
        return response

    async def openapi(self, _request: web.Request) -> web.FileResponse:
        return web.FileResponse(OPENAPI, headers={"Content-Type": "application/json"})


async def _parse(request: web.Request) -> tuple[GenerationRequest, str | None, int] | web.Response:
    """(request, source language, stream interval) from a JSON GenerateRequest, or the error to answer."""
    if request.content_type != "application/json":
        return error_response("INVALID_ARGUMENT", f"send a JSON GenerateRequest (Content-Type: application/json), "
                              f"not {request.content_type or 'a body without a type'}")
    try:
        message = json_format.Parse(await request.text(), pb.GenerateRequest())
        generation = convert.request_from_proto(message)
    except (json_format.ParseError, ValueError) as exc:
        return error_response("INVALID_ARGUMENT", f"not a valid GenerateRequest: {exc}")
    if not generation.request_id and request.headers.get("X-Request-Id"):
        generation = _with_request_id(generation, request.headers["X-Request-Id"])
    text = message.text if message.WhichOneof("input") == "text" else None
    source_language = text.source_language if text is not None and text.HasField("source_language") else None
    return generation, source_language, message.stream_interval


def _with_request_id(generation: GenerationRequest, request_id: str) -> GenerationRequest:
    return dataclasses.replace(generation, request_id=request_id[:128])


def _stream_message(item: StreamedToken | GenerationResult):
    if isinstance(item, StreamedToken):
        return convert.token_event_to_proto(item)
    return convert.final_to_proto(item)


def _dict(message) -> dict:
    return json_format.MessageToDict(message, always_print_fields_with_no_presence=True)


def _message(message) -> web.Response:
    return web.json_response(_dict(message))


def _ndjson_frame(item, error: bool = False) -> bytes:
    body = item if isinstance(item, dict) else _dict(item)
    return (json.dumps(body, ensure_ascii=False) + "\n").encode()


def _sse_frame(item, error: bool = False) -> bytes:
    body = item if isinstance(item, dict) else _dict(item)
    event = "event: error\n" if error else ""
    return f"{event}data: {json.dumps(body, ensure_ascii=False)}\n\n".encode()
