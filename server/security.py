"""Transport security and authentication: optional TLS (with optional client certificates) and bearer tokens.

Both are off by default, for a server on loopback. With `--tls-cert`/`--tls-key` the port speaks only TLS;
with `--tls-client-ca` too, clients must present a certificate that CA signed (mutual TLS). With
`--auth-token-file`, every RPC but health checking needs `authorization: Bearer <token>` metadata
naming one of the file's tokens (one per line, so a token can be rotated without a gap); the others are
answered UNAUTHENTICATED before their request is parsed. Health stays open so that load balancers and
orchestrators can probe without a secret.
"""

from __future__ import annotations

import dataclasses
import hmac
import pathlib
from collections.abc import Awaitable, Callable

import grpc

from attnserve.server import errors, logging_setup, memory, metrics

# Methods anyone may call: the standard health service.
OPEN_PREFIXES = ("/grpc.health.v1.Health/",)


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    cert: str  # PEM certificate chain of the server
    key: str  # PEM private key of that certificate
    client_ca: str | None = None  # PEM CA bundle; set = clients must present a certificate it signed


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """The gRPC credentials of a TLS port.

    Raises:
        ValueError: a file cannot be read (the message names the flag and the file).
    """
    key = _read(files.key, "--tls-key")
    cert = _read(files.cert, "--tls-cert")
    ca = _read(files.client_ca, "--tls-client-ca") if files.client_ca else None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)


def read_tokens(path: str) -> frozenset[str]:
    """The tokens of a token file: one per line; blank lines and lines starting with # are skipped.

    Raises:
        ValueError: the file cannot be read or holds no token.
    """
    lines = _read(path, "--auth-token-file").decode("utf-8", errors="strict").splitlines()
    tokens = frozenset(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#"))
    if not tokens:
        raise ValueError(f"--auth-token-file {path}: holds no token")
    return tokens


def _read(path: str, flag: str) -> bytes:
    try:
        return pathlib.Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{flag} {path}: cannot be read: {exc.strerror or exc}") from None


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Answers UNAUTHENTICATED to calls without a valid bearer token (health checks excepted).

    Args:
        tokens: the accepted tokens.
        counted: methods ("/package.Service/Method") whose refusals are counted as generation requests in
            the metrics, under model "" (the request is never parsed, so its model is unknown).
    """

    def __init__(self, tokens: frozenset[str], counted: frozenset[str] = frozenset()):
        self._tokens = [token.encode() for token in tokens]
        self._counted = counted

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_PREFIXES) or self._authorized(details):
            return handler
        logging_setup.rejections.log("%s: UNAUTHENTICATED", details.method)
        if details.method in self._counted:
            metrics.count_request("", grpc.StatusCode.UNAUTHENTICATED.name)
        return _denying(handler)

    def _authorized(self, details: grpc.HandlerCallDetails) -> bool:
        values = [value for key, value in details.invocation_metadata or () if key == "authorization"]
        if len(values) != 1:
            return False
        value = values[0].encode() if isinstance(values[0], str) else values[0]
        scheme, _, token = value.partition(b" ")
        # Compared in constant time against every token, so timing tells nothing about any of them.
        matches = [hmac.compare_digest(token.strip(), known) for known in self._tokens]
        return scheme.lower() == b"bearer" and any(matches)


def _denying(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that refuses the call without parsing its request."""

    async def deny(_request, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")

    def ignore(data: bytes) -> None:
        errors.note_received()  # refused here, not by gRPC's receive limit
        memory.RECLAIMER.released(len(data))  # never parsed, but received: a large one is worth a trim
        return None

    wire = {"request_deserializer": ignore, "response_serializer": handler.response_serializer}
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(deny, **wire)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(deny, **wire)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(deny, **wire)
    return grpc.stream_stream_rpc_method_handler(deny, **wire)
