"""Runs the attnserve gRPC server: the AttnServe service, standard health checking and server reflection.

The server listens on port 50051 unless told otherwise (`convert.DEFAULT_PORT`). The port opens once the
models are loaded and each has answered a warm-up request; health then reports SERVING overall (""), for
"attnserve.v1.AttnServe" and under each model's name (a model skipped as broken is NOT_SERVING there).
Requests larger than any served model accepts are refused before they are parsed (server/engine/limits.py). On
SIGTERM or SIGINT the server drains (server/edge/lifecycle.py): health NOT_SERVING, new generation calls
UNAVAILABLE, in-flight requests finish within the grace period; then gRPC stops and the engines close.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import threading
from collections.abc import Mapping

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from attnserve.server.edge import errors, intake, lifecycle, logging_setup, memory, metrics, readiness, security, service
from attnserve.server.engine import limits
from attnserve.server.edge import startup_log
from attnserve.server.edge.serve_options import ServeOptions  # noqa: F401  (re-exported: app.ServeOptions)
from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["AttnServe"].full_name  # "attnserve.v1.AttnServe"
_HEALTH_SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name


# How long closing the engines may take once the drain is over. The manifests' terminationGracePeriodSeconds
# is the preStop pause + --grace-seconds + this (tests/test_deploy_k8s.py checks it).
CLOSE_SECONDS = 5.0

_GENERATION_METHODS = frozenset(f"/{SERVICE_NAME}/{name}" for name in ("Generate", "GenerateStream"))
_SERVING, _NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


class Server:
    """A started gRPC server and the engines it serves; `stop` drains, then shuts both down in order."""

    def __init__(
        self,
        server: grpc.aio.Server,
        health: readiness.HealthServicer,
        engines: Mapping,
        port: int,
        drain: lifecycle.Drain,
        limits_: limits.MessageLimits,
        servicer: service.AttnServeServicer | None = None,
    ):
        self.grpc_server = server
        self.health = health
        self.engines = engines
        self.port = port  # the bound port (useful when asked for port 0)
        self.drain_state = drain
        self.limits = limits_
        self.intakes: Mapping[str, intake.Intake] = servicer.intakes if servicer else {}  # each model's
        self.costs = servicer.costs if servicer else {}  # each model's cost model (server/engine/cost.py)

    async def drain(self, grace: float | None) -> lifecycle.DrainOutcome:
        """Health NOT_SERVING, new generation calls UNAVAILABLE; waits up to `grace` s for in-flight ones."""
        await self.health.enter_graceful_shutdown()
        return await self.drain_state.drain(grace)

    async def close(self) -> None:
        """Stops gRPC at once (cancelling what is left), then closes the engines, all at once, within
        CLOSE_SECONDS (engine processes still running then are killed)."""
        await self.grpc_server.stop(0)
        for pool in self.intakes.values():
            pool.close()
        await _close_within(self.engines, CLOSE_SECONDS)

    def force_close(self) -> None:
        """Kills the engine processes (--engine-process) that are still closing; a second signal's doing."""
        for model_engine in self.engines.values():
            if hasattr(model_engine, "kill"):
                model_engine.kill()

    async def stop(self, grace: float | None) -> None:
        """Drains for up to `grace` seconds, then closes."""
        outcome = await self.drain(grace)
        logger.info("drained: %d in-flight requests finished, %d cut off", outcome.finished, outcome.cut_off)
        await self.close()


async def start(
    engines: Mapping[str, service.Engine],
    address: str,
    *,
    broken: Mapping[str, str] | None = None,
    tls: security.TlsFiles | None = None,
    tokens: frozenset[str] | security.TokenFile | None = None,
    max_inflight_bytes: int | None = None,
    intake_options: intake.IntakeOptions = intake.IntakeOptions(),
    deadline_admission: bool = True,
) -> Server:
    """Starts serving `engines` (model name -> engine) on `address`, e.g. "127.0.0.1:50051", "[::]:50051" or "127.0.0.1:0".

    Args:
        broken: models that failed to load (name -> reason): NOT_SERVING, and calls naming them FAILED_PRECONDITION.
        tls: serve TLS only, with these files; None = plaintext.
        tokens: accepted bearer tokens, or the file they are read from (re-read when it changes); None = no
            authentication.
        max_inflight_bytes: bytes of generation requests handled at once; None = 8 of the largest.
        intake_options: each model's preprocessing pool, queue bound and decoded-bytes budget.
        deadline_admission: refuse at once what cannot finish before its deadline (server/engine/cost.py).

    Raises:
        OSError: the address cannot be bound (in use, or not an address of this machine).
        ValueError: a TLS file cannot be read, or the in-flight budget cannot hold one request.
    """
    memory.fix_mmap_threshold()  # request-sized buffers go back to the system when freed (server/edge/memory.py)
    message_limits, admission = _admission(engines, max_inflight_bytes)
    server = _grpc_server(message_limits, admission, tokens, engines)
    drain = lifecycle.Drain()
    # With tokens a client is its token (checked before any handler runs), else its IP address.
    servicer = service.AttnServeServicer(engines, drain, broken, intake_options, deadline_admission,
                                         client_by_token=bool(tokens))
    health_servicer = await _add_services(server, servicer, engines, broken)
    port = _listen(server, address, tls)
    await server.start()
    # The engines were loaded (and warmed up, by `serve`) before the server was built: ready once it listens.
    await _announce(health_servicer, engines, broken, address, port, tls)
    return Server(server, health_servicer, engines, port, drain, message_limits, servicer)


def _admission(engines: Mapping[str, service.Engine], max_inflight_bytes: int | None):
    """The message size limits of the served models, and the admission of generation calls within them and
    within the in-flight budget (None = 8 of the largest requests)."""
    message_limits = _message_limits(engines)
    inflight = max_inflight_bytes or 8 * message_limits.receive_bytes
    if inflight < message_limits.receive_bytes:
        raise ValueError(
            f"--max-inflight-request-mb {inflight / 2**20:.2f} is below the largest request a served model "
            f"accepts ({message_limits.receive_bytes / 2**20:.2f} MiB)"
        )
    return message_limits, limits.RequestAdmission(message_limits, limits.InflightBytes(inflight), _GENERATION_METHODS)


def _grpc_server(message_limits: limits.MessageLimits, admission: limits.RequestAdmission,
                 tokens: frozenset[str] | security.TokenFile | None,
                 engines: Mapping[str, service.Engine]) -> grpc.aio.Server:
    """The grpc.aio server with its interceptors and transport options (nothing registered yet)."""
    # The token check comes first, so that an unauthenticated call is refused before anything is parsed.
    interceptors = [security.TokenInterceptor(tokens, _GENERATION_METHODS)] if tokens else []
    return grpc.aio.server(
        interceptors=[*interceptors, errors.ErrorInterceptor(admission, _GENERATION_METHODS, engines)],
        options=[
            ("grpc.max_send_message_length", message_limits.send_bytes),
            # Refused by gRPC before any of it reaches Python; per-model limits are checked before parsing.
            ("grpc.max_receive_message_length", message_limits.receive_bytes),
            # gRPC sets SO_REUSEPORT by default on Linux: a second server on a port in use would start and
            # silently share its traffic instead of failing.
            ("grpc.so_reuseport", 0),
            # Bandwidth probing grows each connection's flow-control window to megabytes, which lets a client
            # push that much of a message gRPC is about to refuse into the transport's buffers (16 refused
            # 30 MiB requests still cost ~100 MB of RSS with it on, ~2 MB with it off).
            ("grpc.http2.bdp_probe", 0),
        ],
    )


async def _add_services(server: grpc.aio.Server, servicer: service.AttnServeServicer,
                        engines: Mapping[str, service.Engine], broken: Mapping[str, str] | None):
    """Registers AttnServe, health (every name NOT_SERVING until the port listens) and reflection."""
    pb_grpc.add_AttnServeServicer_to_server(servicer, server)
    metrics.describe_models(engines.values())
    metrics.track_intakes(servicer.intakes)
    health_servicer = readiness.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection([SERVICE_NAME, _HEALTH_SERVICE_NAME, reflection.SERVICE_NAME], server)
    # grpc's servicer starts out SERVING; nothing is served until the port listens.
    for name in ("", SERVICE_NAME, *engines, *(broken or {})):
        await health_servicer.set(name, _NOT_SERVING)
    return health_servicer


def _listen(server: grpc.aio.Server, address: str, tls: security.TlsFiles | None) -> int:
    """Binds `address` (TLS when given) and returns the port, or says in an OSError why it cannot."""
    try:
        if tls:
            return server.add_secure_port(address, security.server_credentials(tls))
        return server.add_insecure_port(address)
    except RuntimeError as exc:  # grpc raises a bare "Failed to bind" without the address
        # With TLS, a key that does not belong to the certificate fails here too, in the same words.
        hint = "; or --tls-key is not the key of --tls-cert" if tls else ""
        raise OSError(f"cannot listen on {address}: {exc} (in use, or not an address of this machine{hint})") from exc


async def _announce(health_servicer: readiness.HealthServicer, engines: Mapping[str, service.Engine],
                    broken: Mapping[str, str] | None, address: str, port: int, tls: security.TlsFiles | None) -> None:
    """Health SERVING for the loaded models, a watch on engines that can die on their own, and the log lines."""
    for name in ("", SERVICE_NAME, *engines):
        await health_servicer.set(name, _SERVING)
    loop = asyncio.get_running_loop()
    for name, engine in engines.items():  # an engine in a child process (--engine-process) can die on its own
        engine.on_exit = functools.partial(_engine_ended, loop, health_servicer, name)
    for name, reason in (broken or {}).items():
        logger.error("model %r is not served: %s", name, reason)
    scheme = "TLS" if tls else "plaintext"
    logger.info("serving %s on %s (port %d, %s)", ", ".join(sorted(engines)) or "no models", address, port, scheme)


def _message_limits(engines: Mapping[str, service.Engine]) -> limits.MessageLimits:
    """Each model's request limit, as its ModelInfo states it (engines that state none get one from their
    input kind and limits, with 32 characters per text token)."""
    sizes = {
        name: engine.info.max_request_bytes or limits.request_bytes(limits.input_bytes(engine.info))
        for name, engine in engines.items()
    }
    return limits.MessageLimits(sizes)


def _engine_ended(loop: asyncio.AbstractEventLoop, health: readiness.HealthServicer, name: str, reason: str) -> None:
    """A model's engine process died (`reason`, which the engine has logged): the model, the service and the
    server report NOT_SERVING, so that readiness and liveness probes take the server out of rotation and
    restart it (any thread)."""

    async def mark() -> None:
        for key in (name, SERVICE_NAME, ""):
            await health.set(key, _NOT_SERVING)

    try:
        asyncio.run_coroutine_threadsafe(mark(), loop)
    except RuntimeError:
        pass  # the loop is closed: the server is gone already


async def serve_until_signal(server: Server, grace: float | None) -> None:
    """Waits for SIGTERM or SIGINT, then drains and stops `server`; a second signal stops it at once."""
    await lifecycle.serve_until_signal(
        lambda: server.drain(grace), server.close, lambda: server.drain_state.active, grace, server.force_close
    )


async def serve(options: ServeOptions) -> None:
    """Loads and warms up the model repository and serves it until SIGTERM or SIGINT."""
    # Loading builds ONNX Runtime sessions (seconds): off the loop, though nothing else runs yet.
    engines, broken = await asyncio.to_thread(load_models, options)
    try:
        tokens = security.TokenFile(options.auth_token_file) if options.auth_token_file else None
        tls = security.TlsFiles(options.tls_cert, options.tls_key, options.tls_client_ca) if options.tls_cert else None
        if options.metrics_port is not None:
            metrics.serve_http(options.metrics_port, options.metrics_host)
        server = await start(
            engines,
            f"{options.host}:{options.port}",
            broken=broken,
            tls=tls,
            tokens=tokens,
            max_inflight_bytes=int(options.max_inflight_request_mb * 2**20),
            intake_options=intake.IntakeOptions(options.preprocess_threads, options.max_preprocess_queue,
                                                int(options.max_decoded_mb * 2**20)),
            deadline_admission=options.deadline_admission,
        )
        metrics.describe_build(options.batching, options.engine_process)
    except BaseException:
        _close(engines)
        raise
    startup_log.log_start(engines, options)
    await serve_until_signal(server, options.grace_seconds)


def run(options: ServeOptions) -> None:
    """Blocking entry point of `attnserve serve`."""
    logging_setup.configure(options.log_level, options.log_format, native=True)
    asyncio.run(serve(options))


class BackgroundServer:
    """A server on its own event loop thread, for tests, benchmarks and notebooks.

    Args:
        engines: model name -> engine.
        host, port: where to listen (port 0: any free port).
        **start_options: keyword arguments of `start` (broken, tls, tokens, max_inflight_bytes).

    Example:
        with BackgroundServer(engines) as background:
            client = Client(background.address)
    """

    def __init__(self, engines: Mapping[str, service.Engine], host: str = "127.0.0.1", port: int = 0, **start_options):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="attnserve-server", daemon=True)
        self._thread.start()
        try:
            self.server = self.call(start(engines, f"{host}:{port}", **start_options))
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
    engines, _ = load_models(dataclasses.replace(options, skip_broken_models=False))
    return engines


def load_models(options: ServeOptions) -> tuple[dict[str, service.Engine], dict[str, str]]:
    """Loads and warms up every model of `options.models` (blocking: builds ONNX Runtime sessions).

    Returns:
        (engines by name, broken models by name -> reason); the second is empty unless
        `options.skip_broken_models`.

    Raises:
        ValueError: the repository is broken, or (without skip_broken_models) a model in it is; or with
            it, no model loads.
    """
    runtime, batching = options.runtime_options(), options.batching_options()
    broken: dict[str, str] | None = {} if options.skip_broken_models else None
    if options.engine_process:
        from attnserve.server.edge.engine_process import load_process_engines

        engines = load_process_engines(options.models, runtime, batching, broken, options.only_models,
                                       (options.log_level, options.log_format))
    else:
        from attnserve.server.engine import registry as engines_registry

        registry = engines_registry.load_engines(options.models, runtime, batching, broken, options.only_models)
        engines = {name: registry.get(name) for name in registry.names()}
    from attnserve.server.engine import longform

    engines = longform.wrap(engines, longform.LongFormOptions(
        max_seconds=options.long_form_max_minutes * 60, max_recordings=options.max_long_form_recordings,
        max_recordings_per_client=options.max_long_form_recordings_per_client))
    try:
        for name in list(engines):
            try:
                readiness.warm_up(engines[name])
            except Exception as exc:
                if broken is None:
                    raise ValueError(f"model {name!r} failed its warm-up request: {exc!r}") from exc
                broken[name] = f"warm-up request failed: {exc!r}"
                _close({name: engines.pop(name)})
    except BaseException:
        _close(engines)
        raise
    if not engines:
        reasons = "; ".join(f"{name}: {reason}" for name, reason in broken.items())
        raise ValueError(f"{options.models}: no model could be loaded: {reasons}")
    memory.release_free_heap()  # what building the sessions parsed and freed
    return engines, broken or {}


async def _close_within(engines: Mapping[str, service.Engine], seconds: float) -> None:
    """Closes every engine at once, each on a daemon thread of its own (a worker finishing its batch must
    not hold up the loop, the other engines, or the interpreter's exit), waiting at most about `seconds`."""
    loop = asyncio.get_running_loop()
    closed = [loop.create_future() for _ in engines]

    def close_one(name: str, model_engine: service.Engine, done: asyncio.Future) -> None:
        try:
            # Engines in processes take a timeout and kill their child past it; in-process ones join a thread.
            model_engine.close(seconds)
        except Exception:
            logger.exception("closing model %r failed", name)
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
                loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))

    for (name, model_engine), done in zip(engines.items(), closed):
        threading.Thread(target=close_one, args=(name, model_engine, done), name=f"close-{name}", daemon=True).start()
    if closed:
        _, pending = await asyncio.wait(closed, timeout=seconds + 1)
        if pending:
            logger.warning("%d models did not close in %s s; exiting without them", len(pending), seconds)


def _close(engines: Mapping[str, service.Engine]) -> None:
    # One by one, so that a model that fails to close does not keep the others open.
    for name, model_engine in engines.items():
        try:
            model_engine.close()
        except Exception:
            logger.exception("closing model %r failed", name)
