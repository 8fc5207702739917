"""The demo's HTTP gateway (aiohttp): serves the page, its own routes, and the HTTP/JSON API over gRPC.

    attnserve web --address localhost:50051 --port 8080     # then open http://localhost:8080/
    attnserve web --host 0.0.0.0 --tls-cert page.crt --tls-key page.key   # https://: the microphone works
                                                                            # from other machines too

Routes:
    GET  /                      the page (static/index.html; its scripts and styles under /static/)
    /v1/...                     the HTTP/JSON API, the whole gRPC service (http_api.py, docs/http-api.md)
    GET  /api/models            every served model, as ModelInfo JSON (the page's own shape, payload.py)
    POST /api/transcribe?model=M[&hotwords=W1+W2]
                                body: an audio file of any length the server accepts; answers its segments
                                as they are transcribed, then the result with its SRT and WebVTT subtitles,
                                as newline-delimited JSON (clients/web/captions.py)
    POST /api/generate?model=M&to=LANG[&layer=L&heads=H,H]
                                body: JSON {"text": "..."} for a text model, or the raw file with its
                                Content-Type (audio/wav, image/png, image/jpeg) for an audio or image model;
                                answers the result as JSON (clients/web/payload.py), attention at word level;
                                without `to`, the server chooses (the language the text is not written
                                in); `layer` and `heads` (comma-separated) choose the attention shown,
                                as in AttentionOptions; `glossary=1` enforces the model's default glossary;
                                `hotwords` (words separated by spaces) go with audio (DecodingOptions.hotwords)

Errors are {"error": {"code": "INVALID_ARGUMENT", "message": "..."}} with a matching HTTP status
(errors.py). CORS, bearer tokens and HTTPS are the gateway's own HttpOptions (access.py, http_options.py).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import pathlib
from collections.abc import AsyncIterator, Sequence

from aiohttp import web

from attnserve.clients.client import AsyncClient, audio_request, image_request, translation_request, video_request
from attnserve.clients.web import access, captions, payload
from attnserve.clients.web.errors import error_response as _error
from attnserve.clients.web.errors import errors_middleware
from attnserve.clients.web.http_api import HttpApi
from attnserve.clients.web.http_options import HttpOptions
from attnserve.api import convert

STATIC = pathlib.Path(__file__).parent / "static"
DEFAULT_PORT = 8080
CALL_TIMEOUT = 120.0  # seconds per gRPC call, retries included: a long clip on a busy CPU server
_CLIENT = web.AppKey("client", AsyncClient)

# Content type -> request builder; a page sends an animated GIF for a video model as video/gif.
_MEDIA = {"audio": audio_request, "image": image_request, "video": video_request}


def make_app(address: str | Sequence[str], http: HttpOptions = HttpOptions(), **client_options) -> web.Application:
    """The gateway application, calling the gRPC server(s) at `address`.

    Args:
        address: as for `AsyncClient` (several addresses are called in turn).
        http: who may call the gateway (CORS origins, bearer tokens); its TLS is `run`'s.
        client_options: `AsyncClient`'s keyword options (timeout, tls, token, retry).
    """
    # Uploads as large as a long-form recording a server accepts (an hour of WAV, raw), or a gRPC message's
    # worth of media in JSON (base64 makes it a third larger).
    max_body = max(convert.MAX_REQUEST_BYTES, convert.MAX_MESSAGE_BYTES * 4 // 3 + 4096)
    app = web.Application(client_max_size=max_body, middlewares=[errors_middleware])
    access.install(app, http)
    app.cleanup_ctx.append(_client_context(address, {"timeout": CALL_TIMEOUT, **client_options}))
    app.router.add_get("/", _page)
    app.router.add_static("/static/", STATIC)
    app.router.add_get("/api/models", _models)
    app.router.add_post("/api/generate", _generate)
    app.router.add_post("/api/transcribe", functools.partial(captions.transcribe, _CLIENT))
    HttpApi(_CLIENT).add_routes(app.router)
    return app


def run(
    address: str | Sequence[str],
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    http: HttpOptions = HttpOptions(),
    **client_options,
) -> None:
    """Serves the gateway until interrupted (blocking); HTTPS when `http` names a certificate."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = make_app(address, http, **client_options)
    web.run_app(app, host=host, port=port, ssl_context=http.ssl_context(), print=None)


def _client_context(address, options):
    # The gRPC channels belong to the event loop aiohttp runs, so they are made once it runs.
    async def context(app: web.Application) -> AsyncIterator[None]:
        async with AsyncClient(address, **options) as client:
            app[_CLIENT] = client
            yield

    return context


async def _page(_request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html")


async def _models(request: web.Request) -> web.Response:
    infos = await request.app[_CLIENT].list_models()
    return web.json_response([payload.model_json(info) for info in infos])


async def _generate(request: web.Request) -> web.Response:
    model = request.query.get("model", "")
    if not model:
        return _error("INVALID_ARGUMENT", "name a model: /api/generate?model=NAME")
    client = request.app[_CLIENT]
    options = {"model": model, "to": request.query.get("to", ""), "attention": True, "granularity": "words"}
    try:
        options.update(_attention_query(request.query))
    except ValueError as exc:
        return _error("INVALID_ARGUMENT", str(exc))
    kind = request.content_type.split("/")[0]
    if request.content_type == "application/json":
        try:
            text = (await request.json()).get("text", "")
        except (json.JSONDecodeError, AttributeError):
            return _error("INVALID_ARGUMENT", 'the body must be JSON like {"text": "..."}')
        generation_request = translation_request(str(text), **options)
    elif kind == "audio":  # the page's hotwords field (DecodingOptions.hotwords; the server checks them)
        generation_request = audio_request(await request.read(), hotwords=request.query.get("hotwords", "").split(),
                                           **options)
    elif kind in _MEDIA:
        generation_request = _MEDIA[kind](await request.read(), **options)
    else:
        return _error("INVALID_ARGUMENT", f"cannot send {request.content_type or 'a body without a type'}: "
                      "send JSON text, audio/wav, an image or a video")
    if request.query.get("glossary") == "1":  # the model's default glossary (DecodingOptions.use_default_glossary)
        decoding = dataclasses.replace(generation_request.decoding, use_default_glossary=True)
        generation_request = dataclasses.replace(generation_request, decoding=decoding)
    result = await client.generate(generation_request)
    return web.json_response(payload.result_json(result))


def _attention_query(query) -> dict:
    """`layer` and `heads` from the page's query string, as translation_request's options.

    Raises:
        ValueError: a value that is not an integer (or a comma-separated list of them).
    """
    options = {}
    try:
        if query.get("layer", "") != "":
            options["layer"] = int(query["layer"])
        if query.get("heads", "") != "":
            options["heads"] = tuple(int(h) for h in query["heads"].split(","))
    except ValueError:
        raise ValueError(f"layer and heads are integers (heads comma-separated), got "
                         f"layer={query.get('layer', '')!r} heads={query.get('heads', '')!r}") from None
    return options
