"""Who may call the gateway: CORS for pages of other origins, bearer tokens for every caller.

CORS (the Fetch standard's protocol): a preflight `OPTIONS` from an allowed origin is answered 204 with the
methods and headers it may use; one from another origin is 403 and the browser never sends the call. Every
answer to an allowed origin names it in `Access-Control-Allow-Origin` (set as the response is prepared, so
streamed answers get it too). Without an allow-list the gateway answers no preflight: only its own page
(same origin) can call it from a browser, as before.

Tokens: with `HttpOptions.tokens`, /api/ and /v1/ need `Authorization: Bearer <token>`, compared in
constant time, as the gRPC server's TokenInterceptor does; the page, its scripts and the OpenAPI document
stay open. Preflights carry no credentials (browsers never send them), so they are not checked.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from attnserve.clients.web.errors import error_response
from attnserve.clients.web.http_options import HttpOptions

_METHODS = "GET, POST, OPTIONS"
_HEADERS = ("authorization", "content-type", "accept", "x-request-id")
_MAX_AGE = "600"  # seconds a browser may reuse a preflight's answer
_PROTECTED = ("/api/", "/v1/")
_OPEN = ("/v1/openapi.json",)


def install(app: web.Application, options: HttpOptions) -> None:
    """Adds the preflight route, the CORS headers and the token check the options ask for."""
    if options.cors_origins:
        app.router.add_route("OPTIONS", "/{tail:.*}", _preflight(options.cors_origins))
        app.on_response_prepare.append(_allow_origin(options.cors_origins))
    if options.tokens:
        app.middlewares.append(_token_check([t.encode() for t in options.tokens]))


def _allowed(origins: frozenset[str], origin: str | None) -> bool:
    return origin is not None and ("*" in origins or origin in origins)


def _preflight(origins: frozenset[str]):
    async def preflight(request: web.Request) -> web.Response:
        origin = request.headers.get("Origin")
        if not _allowed(origins, origin):
            return error_response("PERMISSION_DENIED", f"origin {origin or '(none)'} may not call this gateway; "
                                  "its operator lists allowed origins with --cors-origin")
        asked = [h.strip().lower() for h in request.headers.get("Access-Control-Request-Headers", "").split(",")]
        refused = [h for h in asked if h and h not in _HEADERS]
        if refused:
            return error_response("PERMISSION_DENIED", f"header(s) {', '.join(refused)} not allowed; "
                                  f"allowed: {', '.join(_HEADERS)}")
        return web.Response(status=204, headers={
            "Access-Control-Allow-Methods": _METHODS,
            "Access-Control-Allow-Headers": ", ".join(_HEADERS),
            "Access-Control-Max-Age": _MAX_AGE,
        })

    return preflight


def _allow_origin(origins: frozenset[str]):
    async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        response.headers.add("Vary", "Origin")  # caches must not serve one origin's answer to another
        if _allowed(origins, origin):
            response.headers["Access-Control-Allow-Origin"] = origin

    return on_prepare


def _token_check(tokens: list[bytes]):
    @web.middleware
    async def check(request: web.Request, handler):
        if request.method == "OPTIONS" or not request.path.startswith(_PROTECTED) or request.path in _OPEN:
            return await handler(request)
        scheme, _, token = request.headers.get("Authorization", "").encode().partition(b" ")
        # Compared in constant time against every token, so timing tells nothing about any of them.
        matches = [hmac.compare_digest(token.strip(), known) for known in tokens]
        if scheme.lower() != b"bearer" or not any(matches):
            return error_response("UNAUTHENTICATED", "missing or invalid bearer token",
                                  headers={"WWW-Authenticate": 'Bearer realm="attnserve"'})
        return await handler(request)

    return check
