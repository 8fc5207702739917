"""The demo's HTTP gateway (aiohttp): serves the page and turns its requests into gRPC calls.

    attnserve web --address localhost:50051 --port 8080     # then open http://localhost:8080/
    attnserve web --host 0.0.0.0 --tls-cert page.crt --tls-key page.key   # https://: the microphone works
                                                                            # from other machines too

Routes:
    GET  /                      the page (static/index.html; its scripts and styles under /static/)
    GET  /api/models            every served model, as ModelInfo JSON
    POST /api/transcribe?model=M  body: an audio file of any length the server accepts; answers its segments
                                as they are transcribed, then the result with its SRT and WebVTT subtitles,
                                as newline-delimited JSON (clients/web/captions.py)
    POST /api/generate?model=M&to=LANG
                                body: JSON {"text": "..."} for a text model, or the raw file with its
                                Content-Type (audio/wav, image/png, image/jpeg) for an audio or image model;
                                answers the result as JSON (clients/web/payload.py), attention at word level;
                                without `to`, text goes into the language it is not written in

A failed call answers {"error": {"code": "INVALID_ARGUMENT", "message": "..."}} with a matching HTTP status,
the server's own message kept whole, so the page can show people what went wrong; anything unexpected is
logged here and answered as INTERNAL without a traceback.
"""

from __future__ import annotations

import functools
import json
import logging
import pathlib
import ssl
from collections.abc import AsyncIterator, Sequence

from aiohttp import web

from attnserve.clients import languages
from attnserve.clients.client import (
    AsyncClient,
    AttnServeError,
    audio_request,
    image_request,
    translation_request,
    video_request,
)
from attnserve.clients.web import captions, payload
from attnserve.server import convert

logger = logging.getLogger(__name__)

STATIC = pathlib.Path(__file__).parent / "static"
DEFAULT_PORT = 8080
CALL_TIMEOUT = 120.0  # seconds per gRPC call, retries included: a long clip on a busy CPU server
_CLIENT = web.AppKey("client", AsyncClient)

# gRPC status -> HTTP status of the gateway's answer.
_HTTP_STATUS = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "OUT_OF_RANGE": 413,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "RESOURCE_EXHAUSTED": 429,
    "UNIMPLEMENTED": 501,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}
# Content type -> request builder; the page sends an animated GIF for a video model as video/gif.
_MEDIA = {"audio": audio_request, "image": image_request, "video": video_request}


def make_app(address: str | Sequence[str], **client_options) -> web.Application:
    """The gateway application, calling the gRPC server(s) at `address`.

    Args:
        address: as for `AsyncClient` (several addresses are called in turn).
        client_options: `AsyncClient`'s keyword options (timeout, tls, token, retry).
    """
    # Uploads as large as a long-form recording a server accepts (an hour of WAV).
    app = web.Application(client_max_size=convert.MAX_REQUEST_BYTES, middlewares=[_errors])
    app.cleanup_ctx.append(_client_context(address, {"timeout": CALL_TIMEOUT, **client_options}))
    app.router.add_get("/", _page)
    app.router.add_static("/static/", STATIC)
    app.router.add_get("/api/models", _models)
    app.router.add_post("/api/generate", _generate)
    app.router.add_post("/api/transcribe", functools.partial(captions.transcribe, _CLIENT))
    return app


def run(address: str | Sequence[str], host: str = "127.0.0.1", port: int = DEFAULT_PORT,
        page_tls: ssl.SSLContext | None = None, **client_options) -> None:
    """Serves the gateway until interrupted (blocking); over HTTPS with `page_tls` (see `tls_context`)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    web.run_app(make_app(address, **client_options), host=host, port=port, print=None, ssl_context=page_tls)


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """The page's HTTPS context. Browsers let a page use the microphone only from a secure origin: https://,
    or http://localhost; from another machine that means HTTPS.

    Raises:
        ValueError: a file cannot be read or the key does not match the certificate.
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot use --tls-cert {cert} with --tls-key {key}: {exc}") from None
    return context


def _client_context(address, options):
    # The gRPC channels belong to the event loop aiohttp runs, so they are made once it runs.
    async def context(app: web.Application) -> AsyncIterator[None]:
        async with AsyncClient(address, **options) as client:
            app[_CLIENT] = client
            yield

    return context


async def _page(_request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html")


@web.middleware
async def _errors(request: web.Request, handler):
    try:
        return await handler(request)
    except AttnServeError as exc:
        return _error(exc.code.name, exc.details)
    except web.HTTPException as exc:
        if exc.status < 400 or not request.path.startswith("/api/"):
            raise
        return web.json_response(payload.error_json(exc.reason.upper().replace(" ", "_"), exc.text), status=exc.status)
    except Exception:
        logger.exception("%s %s failed", request.method, request.path)
        return _error("INTERNAL", "the gateway failed; its log has the details")


async def _models(request: web.Request) -> web.Response:
    infos = await request.app[_CLIENT].list_models()
    return web.json_response([payload.model_json(info) for info in infos])


async def _generate(request: web.Request) -> web.Response:
    model = request.query.get("model", "")
    if not model:
        return _error("INVALID_ARGUMENT", "name a model: /api/generate?model=NAME")
    client = request.app[_CLIENT]
    options = {"model": model, "to": request.query.get("to", ""), "attention": True, "granularity": "words"}
    kind = request.content_type.split("/")[0]
    if request.content_type == "application/json":
        try:
            text = (await request.json()).get("text", "")
        except (json.JSONDecodeError, AttributeError):
            return _error("INVALID_ARGUMENT", 'the body must be JSON like {"text": "..."}')
        if not options["to"]:  # as the CLI does: the language the text is not written in
            options["to"] = languages.default_target(await client.get_model(model), str(text))
        generation_request = translation_request(str(text), **options)
    elif kind in _MEDIA:
        generation_request = _MEDIA[kind](await request.read(), **options)
    else:
        return _error("INVALID_ARGUMENT", f"cannot send {request.content_type or 'a body without a type'}: "
                      "send JSON text, audio/wav, an image or a video")
    result = await client.generate(generation_request)
    return web.json_response(payload.result_json(result))


def _error(code: str, message: str) -> web.Response:
    return web.json_response(payload.error_json(code, message), status=_HTTP_STATUS.get(code, 502))
