"""The gateway's error answers: {"error": {"code", "message"}} with the HTTP status matching the gRPC code.

One middleware turns a failed gRPC call into its JSON answer, the server's message kept whole so people can
read what went wrong; anything unexpected is logged here and answered as INTERNAL without a traceback.
"""

from __future__ import annotations

import logging

from aiohttp import web

from attnserve.clients.client import AttnServeError
from attnserve.clients.web import payload

logger = logging.getLogger(__name__)

# gRPC status -> HTTP status of the gateway's answer.
HTTP_STATUS = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "OUT_OF_RANGE": 413,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "RESOURCE_EXHAUSTED": 429,
    "UNIMPLEMENTED": 501,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}
_API_PREFIXES = ("/api/", "/v1/")


def error_response(code: str, message: str, headers: dict | None = None) -> web.Response:
    """The JSON answer of a failed call; an unlisted code is 502 (the upstream server failed)."""
    return web.json_response(payload.error_json(code, message), status=HTTP_STATUS.get(code, 502), headers=headers)


@web.middleware
async def errors_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except AttnServeError as exc:
        return error_response(exc.code.name, exc.details)
    except web.HTTPException as exc:
        if exc.status < 400 or not request.path.startswith(_API_PREFIXES):
            raise
        code = exc.reason.upper().replace(" ", "_")
        return web.json_response(payload.error_json(code, exc.text), status=exc.status)
    except Exception:
        logger.exception("%s %s failed", request.method, request.path)
        return error_response("INTERNAL", "the gateway failed; its log has the details")
