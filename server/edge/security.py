"""Transport security and authentication: optional TLS (with optional client certificates) and bearer tokens.

Both are off by default, for a server on loopback. With `--tls-cert`/`--tls-key` the port speaks only TLS;
with `--tls-client-ca` too, clients must present a certificate that CA signed (mutual TLS). With
`--auth-token-file`, every RPC but health checking needs `authorization: Bearer <token>` metadata
naming one of the file's tokens (one per line, so a token can be rotated without a gap: add the new one,
move the clients, remove the old one); the others are answered UNAUTHENTICATED before their request is
parsed. The file is re-read when it changes (checked at most every TOKEN_CHECK_SECONDS), without a
restart; a rewrite that cannot be read or holds no token keeps the tokens in force, and says so in the log. Health stays open so that load balancers and
orchestrators can probe without a secret.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import os
import pathlib
import threading
import time
from collections.abc import Awaitable, Callable

import grpc

from attnserve.server.edge import errors, logging_setup, memory, metrics

logger = logging.getLogger(__name__)

# Methods anyone may call: the standard health service.
OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
# How often a call may look at the token file's modification time and size.
TOKEN_CHECK_SECONDS = 1.0


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
    # gRPC would only say "Failed to bind" later: name the file that holds the wrong thing.
    _expect_pem(key, "PRIVATE KEY", f"--tls-key {files.key}", swapped=b"CERTIFICATE" in key)
    _expect_pem(cert, "CERTIFICATE", f"--tls-cert {files.cert}", swapped=b"PRIVATE KEY" in cert)
    if ca is not None:
        _expect_pem(ca, "CERTIFICATE", f"--tls-client-ca {files.client_ca}", swapped=False)
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)


def _expect_pem(data: bytes, label: str, flag: str, swapped: bool) -> None:
    """Raises ValueError unless `data` holds a PEM block whose label ends with `label`."""
    if f"{label}-----".encode() in data and b"-----BEGIN " in data:
        return
    hint = " (are --tls-cert and --tls-key swapped?)" if swapped else ""
    raise ValueError(f"{flag}: holds no PEM {label}{hint}")


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


class TokenFile:
    """The tokens of a token file, re-read when its modification time or size changes.

    Raises:
        ValueError: at construction, as `read_tokens`.
    """

    def __init__(self, path: str, check_seconds: float = TOKEN_CHECK_SECONDS):
        self.path = path
        self._check_seconds = check_seconds
        self._stamp = self._stat()
        self._tokens = read_tokens(path)
        self._checked = time.monotonic()
        self._lock = threading.Lock()

    def current(self) -> frozenset[str]:
        """The tokens in force now (any thread)."""
        now = time.monotonic()
        with self._lock:
            if now - self._checked < self._check_seconds:
                return self._tokens
            self._checked = now
            stamp = self._stat()
            if stamp == self._stamp:
                return self._tokens
            self._stamp = stamp
            try:
                self._tokens = read_tokens(self.path)
                logger.info("--auth-token-file %s changed: %d tokens now", self.path, len(self._tokens))
            except ValueError as exc:
                logger.error("%s; the %d tokens read before stay in force", exc, len(self._tokens))
            return self._tokens

    def _stat(self) -> tuple[int, int] | None:
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return info.st_mtime_ns, info.st_size


def _read(path: str, flag: str) -> bytes:
    try:
        return pathlib.Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{flag} {path}: cannot be read: {exc.strerror or exc}") from None


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Answers UNAUTHENTICATED to calls without a valid bearer token (health checks excepted).

    Args:
        tokens: the accepted tokens, or the file they are read from (re-read when it changes).
        counted: methods ("/package.Service/Method") whose refusals are counted as generation requests in
            the metrics, under model "" (the request is never parsed, so its model is unknown).
    """

    def __init__(self, tokens: frozenset[str] | TokenFile, counted: frozenset[str] = frozenset()):
        self._source = tokens
        self._encoded: tuple[frozenset[str], list[bytes]] | None = None  # the tokens last seen, and as bytes
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
        token = bearer_token(details.invocation_metadata)
        if token is None:
            return False
        # Compared in constant time against every token, so timing tells nothing about any of them.
        matches = [hmac.compare_digest(token, known) for known in self._known()]
        return any(matches)


    def _known(self) -> list[bytes]:
        tokens = self._source.current() if isinstance(self._source, TokenFile) else self._source
        if self._encoded is None or self._encoded[0] is not tokens:
            self._encoded = (tokens, [token.encode() for token in tokens])
        return self._encoded[1]


def bearer_token(metadata) -> bytes | None:
    """The token of a call's one `authorization: Bearer <token>` header; None without one, or with two."""
    values = [value for key, value in metadata or () if key == "authorization"]
    if len(values) != 1:
        return None
    value = values[0].encode() if isinstance(values[0], str) else values[0]
    scheme, _, token = value.partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else None


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
