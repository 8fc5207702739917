"""Runs the attnserve gRPC server: the AttnServe service, standard health checking and server reflection.

The server listens on port 50051 unless told otherwise (`convert.DEFAULT_PORT`). The port opens once the
models are loaded, and health then reports SERVING, both overall ("") and for "attnserve.v1.AttnServe".
On SIGTERM or SIGINT it sets health to NOT_SERVING so load balancers stop sending, lets in-flight RPCs
finish for a grace period, then closes the engines.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import threading
from collections.abc import Mapping

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from attnserve.server import convert, errors, metrics, service
from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["AttnServe"].full_name  # "attnserve.v1.AttnServe"
_HEALTH_SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    models: str = "models"  # model repository folder
    host: str = "[::]"  # interface to listen on; "[::]" = all
    port: int = convert.DEFAULT_PORT
    device: str = "cpu"  # "cpu" or "cuda"
    threads: int = 1  # ONNX Runtime intra-op threads per model
    max_batch_size: int = 16  # most requests that share one encoder/decoder call
    batch_window_ms: float = 5.0  # how long a worker waits for more requests before running a batch
    metrics_port: int | None = None  # serve Prometheus /metrics over HTTP on all interfaces; None = don't
    grace_seconds: float = 10.0  # how long in-flight RPCs may finish after a shutdown signal

    def __post_init__(self):
        # gRPC would take a port outside 0..65535 modulo 65536 and listen somewhere unexpected.
        for name in ("port", "metrics_port"):
            port = getattr(self, name)
            if port is not None and not 0 <= port <= 65535:
                raise ValueError(f"ServeOptions.{name} {port} is out of range: use 1..65535, or 0 for any free port")


class Server:
    """A started gRPC server and the engines it serves; `stop` shuts both down in order."""

    def __init__(self, server: grpc.aio.Server, health: health.aio.HealthServicer, engines: Mapping, port: int):
        self.grpc_server = server
        self.health = health
        self.engines = engines
        self.port = port  # the bound port (useful when asked for port 0)

    async def stop(self, grace: float | None) -> None:
        """Health NOT_SERVING, then stop the server (in-flight RPCs get `grace` seconds), then close engines."""
        await self.health.enter_graceful_shutdown()
        await self.grpc_server.stop(grace)
        # Closing joins worker threads, which may be finishing a batch: keep the loop free meanwhile.
        await asyncio.to_thread(_close, self.engines)


async def start(engines: Mapping[str, service.Engine], address: str) -> Server:
    """Starts serving `engines` (model name -> engine) on `address`, e.g. "[::]:50051" or "127.0.0.1:0".

    Raises:
        OSError: the address cannot be bound (in use, or not an address of this machine).
    """
    server = grpc.aio.server(
        interceptors=[errors.ErrorInterceptor()],
        options=[
            ("grpc.max_send_message_length", convert.MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", convert.MAX_MESSAGE_BYTES),
            # gRPC sets SO_REUSEPORT by default on Linux: a second server on a port in use would start and
            # silently share its traffic instead of failing.
            ("grpc.so_reuseport", 0),
        ],
    )
    pb_grpc.add_AttnServeServicer_to_server(service.AttnServeServicer(engines), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection([SERVICE_NAME, _HEALTH_SERVICE_NAME, reflection.SERVICE_NAME], server)
    # grpc's servicer starts out SERVING; nothing is served until the port listens.
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    try:
        port = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpc raises a bare "Failed to bind" without the address
        raise OSError(f"cannot listen on {address}: {exc}") from exc
    await server.start()
    # The engines were loaded before the server was built, so the server is ready as soon as it listens.
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    logger.info("serving %s on %s (port %d)", ", ".join(sorted(engines)) or "no models", address, port)
    return Server(server, health_servicer, engines, port)


async def serve_until_signal(server: Server, grace: float | None) -> None:
    """Waits for SIGTERM or SIGINT, then stops `server`. A second signal gets the default handling."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, stopping.set)
    try:
        await stopping.wait()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
    logger.info("shutting down: %.1f s for in-flight requests", grace or 0.0)
    await server.stop(grace)


async def serve(options: ServeOptions) -> None:
    """Loads the model repository and serves it until SIGTERM or SIGINT."""
    # Loading builds ONNX Runtime sessions (seconds): off the loop, though nothing else runs yet.
    engines = await asyncio.to_thread(load_engines, options)
    try:
        if options.metrics_port is not None:
            metrics.serve_http(options.metrics_port)
        server = await start(engines, f"{options.host}:{options.port}")
    except BaseException:
        _close(engines)
        raise
    await serve_until_signal(server, options.grace_seconds)


def run(options: ServeOptions) -> None:
    """Blocking entry point of `attnserve serve`."""
    asyncio.run(serve(options))


class BackgroundServer:
    """A server on its own event loop thread, for tests, benchmarks and notebooks.

    Example:
        with BackgroundServer(engines) as background:
            client = Client(background.address)
    """

    def __init__(self, engines: Mapping[str, service.Engine], host: str = "127.0.0.1", port: int = 0):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="attnserve-server", daemon=True)
        self._thread.start()
        try:
            self.server = self.call(start(engines, f"{host}:{port}"))
        except BaseException:
            self._stop_loop()
            raise
        self.address = f"{host}:{self.server.port}"

    def call(self, coroutine):
        """Runs a coroutine on the server's loop and returns its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def stop(self, grace: float | None = None) -> None:
        """Stops the server (closing its engines) and its loop thread."""
        try:
            self.call(self.server.stop(grace))
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def load_engines(options: ServeOptions) -> dict[str, service.Engine]:
    """Loads every model of the repository `options.models` (blocking: builds ONNX Runtime sessions).

    Raises:
        ValueError: the repository or a model in it is broken.
    """
    # Imported here so that the server package (and the client-only CLI) imports without onnxruntime.
    from attnserve.server import engine
    from attnserve.server.batcher import BatchingOptions
    from attnserve.server.runtime import RuntimeOptions

    runtime = RuntimeOptions(device=options.device, intra_op_threads=options.threads)
    batching = BatchingOptions(max_batch_size=options.max_batch_size, window_seconds=options.batch_window_ms / 1000)
    registry = engine.load_engines(options.models, runtime, batching)
    return {name: registry.get(name) for name in registry.names()}


def _close(engines: Mapping[str, service.Engine]) -> None:
    # One by one, so that a model that fails to close does not keep the others open.
    for name, model_engine in engines.items():
        try:
            model_engine.close()
        except Exception:
            logger.exception("closing model %r failed", name)
