"""Who sent a call: the key of limits that bound each client rather than each model (today the long recordings
one client may have at once, server/engine/longform.py).

With --auth-token-file a client is its bearer token: the token check has accepted it before the handler runs,
so a caller cannot make up new keys to escape its bound, and callers behind one address count apart. The
key is a short hash of the token, never the token, so that it may be kept, compared and logged without
holding a secret. Without tokens a client is the peer's IP address, without its port: every connection of
one host is one client, and so is a proxy or gateway in front of the server (the HTTP gateway included), for
all of its users.
"""

from __future__ import annotations

import hashlib
import ipaddress
import urllib.parse

import grpc

from attnserve.server.edge import security

# Hex digits of the token's SHA-256 kept in its key: 64 bits tell a server's tokens apart.
_TOKEN_HASH_DIGITS = 16


def client_key(context: grpc.aio.ServicerContext, by_token: bool) -> str:
    """The key of the call's client: "token:<hash>" when the server takes tokens (`by_token`), else
    "ip:<address>"."""
    token = security.bearer_token(context.invocation_metadata()) if by_token else None
    if token:
        return "token:" + hashlib.sha256(token).hexdigest()[:_TOKEN_HASH_DIGITS]
    return "ip:" + peer_host(context.peer())


def peer_host(peer: str) -> str:
    """The address of a gRPC peer without its port: "ipv4:127.0.0.1:54321" -> "127.0.0.1", "ipv6:[::1]:5555"
    (or its percent-encoded "ipv6:%5B::1%5D:5555") -> "::1", an IPv4 client of a dual-stack listener
    ("ipv6:[::ffff:10.0.0.7]:80") -> "10.0.0.7"; another kind of peer ("unix:/run/attnserve.sock") as it is."""
    peer = urllib.parse.unquote(peer)
    scheme, _, address = peer.partition(":")
    if scheme == "ipv4":
        host = address.rpartition(":")[0]
    elif scheme == "ipv6" and address.startswith("[") and "]" in address:
        host = address[1 : address.index("]")]
    else:
        return peer
    try:
        parsed = ipaddress.ip_address(host)
    except ValueError:
        return peer
    mapped = getattr(parsed, "ipv4_mapped", None)
    return str(mapped or parsed)
