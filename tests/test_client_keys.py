"""Who a client is (server/edge/client_keys.py): its token's hash where the server takes tokens, else its address."""

from __future__ import annotations

import hashlib

import pytest

from attnserve.server.edge.client_keys import client_key, peer_host


class _Context:
    """The two things client_key reads of a grpc.aio.ServicerContext."""

    def __init__(self, peer: str, metadata=()):
        self._peer, self._metadata = peer, tuple(metadata)

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self):
        return self._metadata


@pytest.mark.parametrize("peer, host", [
    ("ipv4:127.0.0.1:54321", "127.0.0.1"),
    ("ipv6:[::1]:5555", "::1"),
    ("ipv6:%5B::1%5D:5555", "::1"),  # newer gRPC releases percent-encode the brackets
    ("ipv6:[2001:db8::7]:443", "2001:db8::7"),
    ("ipv6:[::ffff:10.0.0.7]:80", "10.0.0.7"),  # an IPv4 client of a dual-stack listener
    ("unix:/run/attnserve.sock", "unix:/run/attnserve.sock"),
])
def test_a_peer_is_its_address_without_the_port(peer, host):
    assert peer_host(peer) == host


def test_connections_of_one_host_are_one_client():
    assert client_key(_Context("ipv4:10.1.2.3:40000"), by_token=False) == "ip:10.1.2.3"
    assert client_key(_Context("ipv4:10.1.2.3:40001"), by_token=False) == "ip:10.1.2.3"
    assert client_key(_Context("ipv4:10.1.2.4:40000"), by_token=False) == "ip:10.1.2.4"


def test_with_tokens_a_client_is_a_short_hash_of_its_token_never_the_token():
    alpha = [("authorization", "Bearer alpha-secret")]
    key = client_key(_Context("ipv4:10.1.2.3:40000", alpha), by_token=True)
    assert key == "token:" + hashlib.sha256(b"alpha-secret").hexdigest()[:16] and "secret" not in key
    # The same token from another address is the same client; another token from the same address is not.
    assert client_key(_Context("ipv4:10.9.9.9:1", alpha), by_token=True) == key
    beta = [("authorization", "Bearer beta-secret")]
    assert client_key(_Context("ipv4:10.1.2.3:40000", beta), by_token=True) not in (key, "ip:10.1.2.3")


def test_a_token_a_server_without_tokens_never_checked_does_not_name_the_client():
    # Anyone could send a new made-up token with every call to escape their bound.
    made_up = [("authorization", "Bearer anything")]
    assert client_key(_Context("ipv4:10.1.2.3:40000", made_up), by_token=False) == "ip:10.1.2.3"
    assert client_key(_Context("ipv4:10.1.2.3:40000"), by_token=True) == "ip:10.1.2.3"
