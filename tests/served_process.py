"""A real `attnserve serve` in a child process, for the tests that need the server as users start it.

Imported by test files (tests/ is on sys.path). The command is given whole, so a test can start the
server from any installation (the checkout's venv, a fresh venv made from the wheel).
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

WAIT = 60  # seconds; only guards against hangs (loading models on a busy 2-core machine), never measures


def rss_mib(pid: int) -> float:
    """The resident set size of process `pid`, in MiB (Linux: /proc)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServedProcess:
    """A started server: its gRPC address, its metrics URL and the child process."""

    def __init__(self, process: subprocess.Popen, port: int, metrics_port: int):
        self.process = process
        self.address = f"127.0.0.1:{port}"
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        self.metrics_port = metrics_port

    def health(self) -> int:
        """The overall health status (health_pb2.HealthCheckResponse.SERVING once loaded)."""
        with grpc.insecure_channel(self.address) as channel:
            request = health_pb2.HealthCheckRequest()
            return health_pb2_grpc.HealthStub(channel).Check(request, timeout=WAIT).status

    def metrics(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=WAIT) as page:
            return page.read().decode()

    def stop(self) -> int:
        """SIGTERM, as a container runtime sends; returns the exit status."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=WAIT)


@contextlib.contextmanager
def served(serve_command: Sequence[str], models: str, cwd: str | None = None, env: dict | None = None,
           extra_args: Sequence[str] = ()) -> Iterator[ServedProcess]:
    """Runs `serve_command serve --models models ...` on free loopback ports until the block ends.

    Yields once the gRPC port answers (it opens after the models are loaded); kills the child on the way
    out if the test did not stop it.
    """
    port, metrics_port = free_port(), free_port()
    command = [*serve_command, "serve", "--models", models, "--host", "127.0.0.1", "--port", str(port)]
    command += ["--metrics-port", str(metrics_port), *extra_args]
    # A file, not a pipe: a server that logs every rejected request under load would fill a pipe and stall.
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(command, cwd=cwd, env=env, stderr=log, text=True)
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                try:
                    grpc.channel_ready_future(channel).result(timeout=WAIT)
                except grpc.FutureTimeoutError:
                    process.kill()
                    process.wait()
                    log.seek(0)
                    raise RuntimeError(f"{command} did not start: {log.read()[-2000:]}") from None
            yield ServedProcess(process, port, metrics_port)
        finally:
            if process.poll() is None:
                process.kill()
            process.wait()


def generate_in_engine_process(model_dir, request, wait: float = WAIT):
    """`request` answered by the model of a version folder loaded as `attnserve serve --engine-process` loads
    it (the engine in a child process behind a proxy)."""
    from attnserve.server.edge import app

    options = app.ServeOptions(models=str(model_dir.parent.parent), only_models=(model_dir.parent.name,),
                               engine_process=True)
    engines, _ = app.load_models(options)
    try:
        return engines[model_dir.parent.name].generate(request, wait)
    finally:
        for engine in engines.values():
            engine.close()
