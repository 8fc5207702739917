"""The clients' channels: one per server address, TLS or plaintext, picked in turn (client-side round robin).

On Kubernetes, gRPC's long-lived HTTP/2 connections defeat a Service's connection-level load balancing:
every call of a client goes to the one pod it first connected to. Giving the client every pod's address
(e.g. from a headless Service) spreads the calls; a retried call goes to the next address, so one pod
restarting costs no failed call.

Credentials travel per call: the bearer token as `authorization: Bearer <token>` metadata (what the
server's --auth-token-file checks), TLS on the channel.
"""

from __future__ import annotations

import dataclasses
import itertools
import pathlib
import threading
from collections.abc import Sequence

import grpc
from attnserve.api import convert
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc

_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", convert.MAX_REQUEST_BYTES),
    ("grpc.max_receive_message_length", convert.MAX_MESSAGE_BYTES),
]


@dataclasses.dataclass(frozen=True)
class TlsOptions:
    root_certificates: str | None = None  # PEM file of the CAs to trust; None = the system's roots
    certificate: str | None = None  # PEM certificate chain of this client, for servers that require one
    key: str | None = None  # PEM private key of `certificate`
    server_name: str | None = None  # the name to check the server's certificate against; None = the address's

    def __post_init__(self):
        if (self.certificate is None) != (self.key is None):
            raise ValueError("TlsOptions.certificate and TlsOptions.key go together: give both or neither")

    def credentials(self) -> grpc.ChannelCredentials:
        """The channel credentials (reads the files).

        Raises:
            ValueError: a file cannot be read.
        """
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.root_certificates),
            private_key=_read(self.key),
            certificate_chain=_read(self.certificate),
        )


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        return pathlib.Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None


def split_addresses(address: str | Sequence[str]) -> list[str]:
    """"host:port" or "a:1,b:2" or a list of either -> the addresses, each once, in order.

    Raises:
        ValueError: no address.
    """
    parts = [address] if isinstance(address, str) else list(address)
    addresses = [a.strip() for part in parts for a in part.split(",") if a.strip()]
    if not addresses:
        raise ValueError("no server address given")
    return list(dict.fromkeys(addresses))


def call_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata sent with every call: the bearer token, if any."""
    if token is None:
        return ()
    if not token or any(c in token for c in "\r\n"):
        raise ValueError("the bearer token must be one non-empty line")
    return (("authorization", f"Bearer {token}"),)


@dataclasses.dataclass(frozen=True)
class Endpoint:
    address: str  # "host:port"
    channel: grpc.Channel | grpc.aio.Channel
    stub: pb_grpc.AttnServeStub


class ChannelPool:
    """One channel per address, handed out in turn; `aio` picks grpc.aio channels for asyncio.

    Args:
        addresses: "host:port" of each server.
        tls: None = plaintext; else the TLS settings of every channel.
        aio: make grpc.aio channels (for AsyncClient) instead of blocking ones.
    """

    def __init__(self, addresses: Sequence[str], tls: TlsOptions | None = None, aio: bool = False):
        grpc_api = grpc.aio if aio else grpc
        options = list(_CHANNEL_OPTIONS)
        if tls is not None and tls.server_name:
            options.append(("grpc.ssl_target_name_override", tls.server_name))
        credentials = tls.credentials() if tls is not None else None
        self.endpoints = []
        for address in addresses:
            if credentials is not None:
                channel = grpc_api.secure_channel(address, credentials, options=options)
            else:
                channel = grpc_api.insecure_channel(address, options=options)
            self.endpoints.append(Endpoint(address, channel, pb_grpc.AttnServeStub(channel)))
        self._turns = itertools.cycle(self.endpoints)
        self._lock = threading.Lock()  # blocking clients are shared between threads

    def next(self) -> Endpoint:
        """The endpoint whose turn it is."""
        with self._lock:
            return next(self._turns)
