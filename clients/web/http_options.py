"""The gateway's own HTTP settings: which origins may call it from a browser, its tokens, its certificate.

Kept apart from the aiohttp code so that `attnserve --help` lists these flags without the `web` extra.
The gateway authenticates callers as the gRPC server does (server/edge/security.py): the same token file format
(one token per line, # comments), `Authorization: Bearer <token>`, constant-time comparison; and the same
kind of PEM certificate and key for TLS. Its own calls to the gRPC server use --token-file/--tls-ca.
"""

from __future__ import annotations

import argparse
import dataclasses
import ssl


@dataclasses.dataclass(frozen=True)
class HttpOptions:
    # Origins (scheme://host[:port]) whose pages may call the API from a browser (CORS); "*" = any; empty = none
    # but the gateway's own page.
    cors_origins: frozenset[str] = frozenset()
    # Bearer tokens a caller must present on /api/ and /v1/ (the document and the page stay open); empty = none.
    tokens: frozenset[str] = frozenset()
    # PEM certificate chain and key: set = the gateway listens with TLS (HTTPS) only.
    tls_cert: str | None = None
    tls_key: str | None = None

    def ssl_context(self) -> ssl.SSLContext | None:
        """The listener's TLS context, or None for plain HTTP.

        Raises:
            ValueError: only one of the certificate and key is set, or they cannot be loaded.
        """
        if not self.tls_cert and not self.tls_key:
            return None
        if not (self.tls_cert and self.tls_key):
            raise ValueError("--http-tls-cert and --http-tls-key go together: set both for HTTPS")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.tls_cert, self.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"--http-tls-cert {self.tls_cert} / --http-tls-key {self.tls_key}: {exc}") from None
        return context


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `attnserve web` flags of the gateway's own listener."""
    parser.add_argument(
        "--cors-origin", action="append", default=[], metavar="ORIGIN",
        help="let pages from this origin (e.g. https://app.example.org) call the API; repeat for several; "
        "'*' = any origin (default: none, only the gateway's own page)",
    )
    parser.add_argument(
        "--http-token-file", metavar="FILE",
        help="require `Authorization: Bearer <token>` on the API, one of this file's tokens (one per line, as "
        "the server's --auth-token-file; default: no token)",
    )
    # --tls-cert/--tls-key too: browsers allow the microphone on other machines only over HTTPS.
    parser.add_argument("--http-tls-cert", "--tls-cert", dest="http_tls_cert", metavar="PEM",
                        help="serve HTTPS with this certificate chain (with --http-tls-key); browsers allow the "
                             "microphone on other machines only over HTTPS")
    parser.add_argument("--http-tls-key", "--tls-key", dest="http_tls_key", metavar="PEM",
                        help="the private key of --http-tls-cert")


def from_args(args: argparse.Namespace) -> HttpOptions:
    """The options the flags name.

    Raises:
        ValueError: the token file cannot be read or holds no token.
    """
    tokens = frozenset()
    if args.http_token_file:
        from attnserve.server.edge.security import read_tokens  # the server's reader: one format for both

        tokens = read_tokens(args.http_token_file)
    origins = frozenset(o.rstrip("/") for o in args.cors_origin)
    return HttpOptions(origins, tokens, args.http_tls_cert, args.http_tls_key)
