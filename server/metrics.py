"""Every Prometheus instrument of the server, and the one function that records a finished request.

Core code only returns plain `generation.Timings`; the service layer hands them to `observe_result`.
Names follow `attnserve_<what>_<unit>` in base units with few labels (`model`, `code`).
"""

from __future__ import annotations

import prometheus_client

from attnserve.server import generation

# Latency buckets span a cached short sentence (milliseconds) to a 256-token beam search on CPU.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Queueing is short unless the server is overloaded; the upper buckets show that it is.
_QUEUE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_PER_TOKEN_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)

REQUEST_DURATION = prometheus_client.Histogram(
    "attnserve_request_duration_seconds",
    "Time from accepting a generation request to its result being ready.",
    ["model"],
    buckets=_LATENCY_BUCKETS,
)
QUEUE_DURATION = prometheus_client.Histogram(
    "attnserve_queue_duration_seconds",
    "Time a generation request waited before its first model call.",
    ["model"],
    buckets=_QUEUE_BUCKETS,
)
TIME_TO_FIRST_TOKEN = prometheus_client.Histogram(
    "attnserve_time_to_first_token_seconds",
    "Time from accepting a generation request to its first output token.",
    ["model"],
    buckets=_LATENCY_BUCKETS,
)
TIME_PER_OUTPUT_TOKEN = prometheus_client.Histogram(
    "attnserve_time_per_output_token_seconds",
    "Decode time of a generation request divided by its output tokens.",
    ["model"],
    buckets=_PER_TOKEN_BUCKETS,
)
BATCH_SIZE = prometheus_client.Histogram(
    "attnserve_batch_size",
    "Requests that shared a request's encoder call.",
    ["model"],
    buckets=_BATCH_BUCKETS,
)
REQUESTS = prometheus_client.Counter(
    "attnserve_requests_total",
    "Generation requests finished, by model and gRPC status code.",
    ["model", "code"],
)


def observe_result(result: generation.GenerationResult) -> None:
    """Records the timings of one successful generation request."""
    model, timings = result.model, result.timings
    REQUEST_DURATION.labels(model).observe(timings.total_seconds)
    QUEUE_DURATION.labels(model).observe(timings.queue_seconds)
    TIME_TO_FIRST_TOKEN.labels(model).observe(timings.first_token_seconds)
    if result.tokens:
        TIME_PER_OUTPUT_TOKEN.labels(model).observe(timings.decode_seconds / len(result.tokens))
    BATCH_SIZE.labels(model).observe(timings.batch_size)


def count_request(model: str, code: str) -> None:
    """Counts one finished generation request; `model` must be a served model's name (bounded labels)."""
    REQUESTS.labels(model, code).inc()


def serve_http(port: int, address: str = "0.0.0.0") -> None:
    """Serves /metrics over HTTP from a daemon thread.

    Raises:
        OSError: the port cannot be bound; the message names it.
    """
    try:
        prometheus_client.start_http_server(port, addr=address)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot serve metrics on {address}:{port}: {exc.strerror or exc}") from exc
