"""Every Prometheus instrument of the server, and the functions the service layer records them with.

Core code only returns plain `generation.Timings`; the service layer hands them to `observe_result`, counts
each finished request with `count_request`, and has `track_request` follow each submitted request's future
so that the load gauges (queued, running, rows) are read from live futures when Prometheus scrapes.
Names follow `attnserve_<what>_<unit>` in base units with few labels (`model`, `code`, `reason`).
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Iterable

import prometheus_client
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from attnserve.api import generation

# Latency buckets span a cached short sentence (milliseconds) to a 256-token beam search on CPU.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Queueing is short unless the server is overloaded; then waits of 10-20 s were seen, so the buckets reach
# a minute (a client deadline usually ends the wait before that).
_QUEUE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)
# One encoder call or one decoder step of a batch: sub-millisecond for the tiny models, ~100 ms for a wide
# batch of long sources on CPU.
_MODEL_CALL_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_PER_TOKEN_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)

# Status codes that mean the server refused a request it could not or would not run, and the reason a
# refusal is counted under when the error names none (OverloadedError and the admission checks name theirs:
# queue_full, inflight_bytes, decoded_bytes, preprocess_queue_full, long_form_recordings,
# long_form_recordings_per_client, deadline, unparsable).
REJECTION_REASONS = {
    "RESOURCE_EXHAUSTED": "queue_full",
    "OUT_OF_RANGE": "too_large",
    "INVALID_ARGUMENT": "invalid",
    "UNAUTHENTICATED": "unauthenticated",
    "NOT_FOUND": "unknown_model",
    "FAILED_PRECONDITION": "model_not_served",
}

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
ENCODE_DURATION = prometheus_client.Histogram(
    "attnserve_encode_duration_seconds",
    "Encoder call of the batch a generation request ran in.",
    ["model"],
    buckets=_MODEL_CALL_BUCKETS,
)
DECODE_STEP_DURATION = prometheus_client.Histogram(
    "attnserve_decode_step_duration_seconds",
    "Decode time of a generation request divided by its decoder steps (output tokens, plus one for EOS).",
    ["model"],
    buckets=_MODEL_CALL_BUCKETS,
)
BATCH_SIZE = prometheus_client.Histogram(
    "attnserve_batch_size",
    "Most requests that shared a decoder call with a request (itself included).",
    ["model"],
    buckets=_BATCH_BUCKETS,
)
REQUESTS = prometheus_client.Counter(
    "attnserve_requests_total",
    "Generation requests finished, by model and gRPC status code.",
    ["model", "code"],
)
REJECTED_REQUESTS = prometheus_client.Counter(
    "attnserve_rejected_requests_total",
    "Generation requests refused without a result, at any layer (before parsing, at admission, at a queue), "
    "by status code and reason (metrics.REJECTION_REASONS and the admission checks' own).",
    ["model", "code", "reason"],
)
INPUT_TOKENS = prometheus_client.Counter(
    "attnserve_input_tokens_total",
    "Source tokens of answered requests (attention columns for audio and images).",
    ["model"],
)
OUTPUT_TOKENS = prometheus_client.Counter(
    "attnserve_output_tokens_total",
    "Generated tokens of answered requests (EOS excluded).",
    ["model"],
)
MAX_ROWS = prometheus_client.Gauge(
    "attnserve_max_rows",
    "Batch rows a model may decode at once (--max-rows; continuous batching): attnserve_running_rows' ceiling.",
    ["model"],
)
BUILD_INFO = prometheus_client.Gauge(
    "attnserve_build_info",
    "1, labelled with the server's version, its Python and ONNX Runtime versions and how it batches.",
    ["version", "python", "onnxruntime", "batching", "engine_process"],
)
MODEL_INFO = prometheus_client.Gauge(
    "attnserve_model_info",
    "1 for each served model: its version and the ONNX Runtime execution provider it runs on.",
    ["model", "version", "provider"],
)


def observe_result(result: generation.GenerationResult) -> None:
    """Records the timings and token counts of one successful generation request."""
    model, timings = result.model, result.timings
    REQUEST_DURATION.labels(model).observe(timings.total_seconds)
    QUEUE_DURATION.labels(model).observe(timings.queue_seconds)
    TIME_TO_FIRST_TOKEN.labels(model).observe(timings.first_token_seconds)
    ENCODE_DURATION.labels(model).observe(timings.encode_seconds)
    steps = len(result.tokens) + (result.finish_reason is generation.FinishReason.EOS)
    if steps:
        DECODE_STEP_DURATION.labels(model).observe(timings.decode_seconds / steps)
    if result.tokens:
        TIME_PER_OUTPUT_TOKEN.labels(model).observe(timings.decode_seconds / len(result.tokens))
    BATCH_SIZE.labels(model).observe(timings.batch_size)
    INPUT_TOKENS.labels(model).inc(len(result.source_tokens))
    OUTPUT_TOKENS.labels(model).inc(len(result.tokens))


def count_request(model: str, code: str, reason: str | None = None) -> None:
    """Counts one finished generation request, and a refused one under its reason too.

    `model` must be a served model's name or "" (bounded labels); `code` a grpc.StatusCode name; `reason`
    the refusal's, None = the code's (REJECTION_REASONS; codes there are refusals whatever the reason).
    """
    REQUESTS.labels(model, code).inc()
    if code in REJECTION_REASONS:
        REJECTED_REQUESTS.labels(model, code, reason or REJECTION_REASONS[code]).inc()


def describe_models(engines: Iterable) -> None:
    """Publishes `attnserve_model_info` for each served engine (see service.Engine), and its load gauges at 0."""
    for engine in engines:
        # The Engine protocol has no providers: ModelEngine and ProcessEngine say them; test doubles do not.
        providers = getattr(engine, "providers", None) or [""]
        info, provider = engine.info, providers[0]
        MODEL_INFO.labels(info.name, str(info.version), provider).set(1)
        max_rows = getattr(engine, "max_rows", None)  # continuous batching's; windowed batches have none
        if max_rows is not None:
            MAX_ROWS.labels(info.name).set(max_rows)
        _LOAD.add_models([info.name])


def describe_build(batching: str, engine_process: bool) -> None:
    """Publishes `attnserve_build_info` (versions read from the installed distributions)."""
    import importlib.metadata
    import platform

    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return ""

    runtime = version("onnxruntime") or version("onnxruntime-gpu")
    BUILD_INFO.labels(version("attnserve"), platform.python_version(), runtime, batching,
                      str(engine_process).lower()).set(1)


class _IntakeCollector(Collector):
    """Each model's preprocessing queue and decoded bytes in flight (server/edge/intake.py), read at scrape time."""

    def __init__(self):
        self.intakes: dict = {}  # model -> Intake; the latest server's

    def collect(self):
        queued = GaugeMetricFamily("attnserve_preprocess_queue_depth",
                                   "Requests waiting for a preprocessing thread of their model.", labels=["model"])
        decoded = GaugeMetricFamily(
            "attnserve_decoded_bytes_in_flight",
            "Bytes the inputs being (or waiting to be) preprocessed decode to, as their headers declare.",
            labels=["model"])
        for model, intake in sorted(self.intakes.items()):
            queued.add_metric([model], intake.queued)
            decoded.add_metric([model], intake.decoded_bytes)
        return [queued, decoded]

    def describe(self):
        return []


_INTAKES = _IntakeCollector()
prometheus_client.REGISTRY.register(_INTAKES)


def track_intakes(intakes) -> None:
    """Reports these intakes (model -> Intake) from now on."""
    _INTAKES.intakes = dict(intakes)


class _LoadCollector(Collector):
    """Requests between submission and result, read from their futures at scrape time.

    A future that is neither running nor done waits in its model's queue; the batcher marks it running
    when it joins a batch. Counting live futures, rather than moving gauges up and down at each
    transition, cannot drift when a request is cancelled or fails on any path.
    """

    def __init__(self):
        self._lock = threading.Lock()
        # future -> (model, batch rows it takes: one per beam)
        self._requests: dict[concurrent.futures.Future, tuple[str, int]] = {}
        # Models served or seen: their gauges read 0 when idle instead of vanishing (a panel shows 0, not a gap).
        self._models: set[str] = set()

    def add_models(self, names: Iterable[str]) -> None:
        with self._lock:
            self._models.update(names)

    def track(self, model: str, rows: int, future: concurrent.futures.Future) -> None:
        with self._lock:
            self._models.add(model)
            self._requests[future] = (model, rows)
        future.add_done_callback(self._forget)  # runs at once if it is already done

    def _forget(self, future: concurrent.futures.Future) -> None:
        with self._lock:
            self._requests.pop(future, None)

    def collect(self):
        queued = GaugeMetricFamily("attnserve_queue_depth", "Requests waiting for a batch.", labels=["model"])
        running = GaugeMetricFamily(
            "attnserve_running_requests", "Requests in a running batch (being encoded or decoded).", labels=["model"]
        )
        rows = GaugeMetricFamily(
            "attnserve_running_rows", "Batch rows of the running requests (one per beam).", labels=["model"]
        )
        in_flight = GaugeMetricFamily(
            "attnserve_requests_in_flight", "Requests submitted to a model and not yet finished.", labels=["model"]
        )
        counts: dict[str, list[int]] = {}  # model -> [queued, running, rows]
        with self._lock:
            tracked, models = list(self._requests.items()), set(self._models)
        for future, (model, width) in tracked:
            count = counts.setdefault(model, [0, 0, 0])
            if future.running():
                count[1] += 1
                count[2] += width
            elif not future.done():
                count[0] += 1
        for model in sorted(models):
            q, r, w = counts.get(model, (0, 0, 0))
            queued.add_metric([model], q)
            running.add_metric([model], r)
            rows.add_metric([model], w)
            in_flight.add_metric([model], q + r)
        return [queued, running, rows, in_flight]

    def describe(self):
        return []  # keeps the registry from calling collect() at registration


_LOAD = _LoadCollector()
prometheus_client.REGISTRY.register(_LOAD)


def track_request(request: generation.GenerationRequest, future: concurrent.futures.Future,
                  default_beam_size: int = 1) -> None:
    """Follows a submitted request's future for the load gauges until it is done (any thread).

    Args:
        default_beam_size: the model's beams for a request that names none (ModelInfo.default_beam_size).
    """
    rows = generation.resolved_beam_size(request.decoding, default_beam_size)
    _LOAD.track(request.model, rows, future)


def serve_http(port: int, address: str = "0.0.0.0") -> None:
    """Serves /metrics over HTTP from a daemon thread.

    Raises:
        OSError: the port cannot be bound; the message names it.
    """
    try:
        prometheus_client.start_http_server(port, addr=address)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot serve metrics on {address}:{port}: {exc.strerror or exc}") from exc
