"""The web gateway on its own event-loop thread, on a free loopback port, for the web and browser tests.

Imported by test files (tests/ is on sys.path).
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import threading
from collections.abc import Iterator

from aiohttp import web
from attnserve.clients.client import Client
from attnserve.clients.web import gateway
from attnserve.clients.web.http_options import HttpOptions
from attnserve.server.edge import app
from fakes import WAIT


class BackgroundGateway:
    """`attnserve web` in a thread: `url` is where the page is; `stop` (or leaving the block) ends it."""

    def __init__(self, address: str, http: HttpOptions = HttpOptions(), **client_options):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="attnserve-web", daemon=True)
        self._thread.start()
        self._runner = web.AppRunner(gateway.make_app(address, http, **client_options))
        self._call(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=http.ssl_context())
        self._call(site.start())
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"{'https' if http.tls_cert else 'http'}://127.0.0.1:{port}"

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def stop(self) -> None:
        self._call(self._runner.cleanup())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> BackgroundGateway:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


@contextlib.contextmanager
def demo(*repositories: pathlib.Path, http: HttpOptions = HttpOptions()) -> Iterator[tuple[str, Client]]:
    """(gateway url, client): every model of the repositories on one in-process server, behind the gateway."""
    engines = {}
    for repository in repositories:
        engines.update(app.load_engines(app.ServeOptions(models=str(repository))))
    with app.BackgroundServer(engines) as server, BackgroundGateway(server.address, http) as web_gateway:
        with Client(server.address, timeout=WAIT) as client:
            yield web_gateway.url, client
