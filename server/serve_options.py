"""The options of `attnserve serve`: one frozen dataclass, the one home of every default, and its flags.

The CLI builds its flags from the dataclass (`add_arguments`), so the defaults the help shows are the ones
the server uses; errors name the flag a user typed, not a field name.
"""

from __future__ import annotations

import argparse
import dataclasses

from attnserve.server import convert, logging_setup

LOOPBACK = "127.0.0.1"
# How a worker batches requests: "continuous" admits them into the running batch at every decode step
# (server/continuous.py); "window" waits --batch-window-ms for a batch to fill, and a batch admits no one
# once it runs (server/batcher.py).
BATCHING_MODES = ("continuous", "window")
# --io-binding -> RuntimeOptions.io_binding.
IO_BINDING = {"auto": None, "on": True, "off": False}


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    models: str = "models"  # model repository folder
    # Serve only these models of the repository (e.g. one model per deployment); empty = every model.
    only_models: tuple[str, ...] = ()
    host: str = "[::]"  # interface to listen on; "[::]" = all
    port: int = convert.DEFAULT_PORT
    device: str = "cpu"  # "cpu" or "cuda"
    # Keep decoder inputs (encoder K/V, the K/V cache) on the device between steps: "auto" = on for cuda.
    io_binding: str = "auto"
    threads: int = 1  # ONNX Runtime intra-op threads per model
    batching: str = "continuous"  # one of BATCHING_MODES
    # Most requests that start together in one encoder call: admitted at one step, or one windowed batch.
    max_batch_size: int = 16
    batch_window_ms: float = 5.0  # --batching window: how long a worker waits for more requests
    max_queue_size: int = 256  # requests waiting per model beyond its running batch; more are RESOURCE_EXHAUSTED
    max_attention_values: int = 0  # most attention weights per response; 0 = only the models' own bounds
    max_beam_size: int = 16  # largest beam_size a request may ask for
    variant: str | None = None  # serve each model's graphs of this manifest variant (e.g. int8) where it has one
    max_rows: int = 64  # continuous batching: rows (beams count one each) decoding together per model
    fair_share_row_steps: int = 512  # continuous batching: rows x steps before a request yields to the queue
    admission_hold_steps: int = 0  # continuous batching: steps a few queued requests may wait for company
    # Continuous batching: encode requests admitted mid-flight on a second thread while the batch steps.
    overlap_encoding: bool = True
    # Continuous batching: decode requests of much longer sources in a second lane when padding costs more.
    length_split: bool = True
    # Run each model's engine in a child process, so that the gRPC loop and the decode loop share no GIL.
    engine_process: bool = False
    metrics_port: int | None = None  # serve Prometheus /metrics over HTTP; None = don't
    # Interface of the metrics listener. Loopback by default, whatever --host says: metrics name the models
    # and show the traffic, so exposing them is a separate, explicit choice.
    metrics_host: str = LOOPBACK
    grace_seconds: float = 10.0  # how long in-flight requests may finish after a shutdown signal
    # Bytes of requests handled at once (audio and images are the big ones); more are RESOURCE_EXHAUSTED.
    max_inflight_request_mb: float = 256.0
    skip_broken_models: bool = False  # serve the healthy models when some fail to load (those: NOT_SERVING)
    tls_cert: str | None = None  # PEM certificate chain; with tls_key the port speaks TLS only
    tls_key: str | None = None  # PEM private key
    tls_client_ca: str | None = None  # PEM CA bundle: clients must present a certificate it signed
    auth_token_file: str | None = None  # accepted bearer tokens, one per line; None = no authentication
    log_level: str = "info"  # debug, info, warning, error
    log_format: str = "text"  # text or json (one object per line)

    def __post_init__(self):
        problems = list(_problems(self))
        if problems:
            raise ValueError("; ".join(problems))


def _problems(o: ServeOptions):
    """Every invalid value or combination, each naming its flag."""
    # gRPC would take a port outside 0..65535 modulo 65536 and listen somewhere unexpected.
    for flag, port in (("--port", o.port), ("--metrics-port", o.metrics_port)):
        if port is not None and not 0 <= port <= 65535:
            yield f"{flag} {port} is out of range: use 1..65535, or 0 for any free port"
    for flag, value, least in (
        ("--threads", o.threads, 1),
        ("--max-batch-size", o.max_batch_size, 1),
        ("--max-queue-size", o.max_queue_size, 1),
        ("--max-attention-values", o.max_attention_values, 0),
        ("--max-beam-size", o.max_beam_size, 1),
        ("--max-rows", o.max_rows, 1),
        ("--fair-share-row-steps", o.fair_share_row_steps, 1),
        ("--admission-hold-steps", o.admission_hold_steps, 0),
    ):
        if value < least:
            yield f"{flag} must be at least {least}, got {value}"
    for flag, value in (("--batch-window-ms", o.batch_window_ms), ("--grace-seconds", o.grace_seconds)):
        if value < 0:
            yield f"{flag} must be >= 0, got {value}"
    if o.batching == "continuous" and o.max_beam_size > o.max_rows:
        yield f"--max-beam-size {o.max_beam_size} needs --max-rows of at least as many, got {o.max_rows}"
    if o.max_inflight_request_mb <= 0:
        yield f"--max-inflight-request-mb must be > 0, got {o.max_inflight_request_mb}"
    if (o.tls_cert is None) != (o.tls_key is None):
        yield "--tls-cert and --tls-key go together: give both or neither"
    if o.tls_client_ca is not None and o.tls_cert is None:
        yield "--tls-client-ca needs --tls-cert and --tls-key (client certificates are checked over TLS)"
    if o.batching not in BATCHING_MODES:
        yield f"--batching {o.batching!r} is not one of {', '.join(BATCHING_MODES)}"
    if o.device not in ("cpu", "cuda"):
        yield f"--device {o.device!r} is not cpu or cuda"
    if o.io_binding not in IO_BINDING:
        yield f"--io-binding {o.io_binding!r} is not one of {', '.join(IO_BINDING)}"
    if o.log_level not in logging_setup.LEVELS:
        yield f"--log-level {o.log_level!r} is not one of {', '.join(logging_setup.LEVELS)}"
    if o.log_format not in logging_setup.FORMATS:
        yield f"--log-format {o.log_format!r} is not one of {', '.join(logging_setup.FORMATS)}"


# Flag -> (field, argparse keywords). The help text of each flag shows the dataclass default.
_FLAGS: dict[str, tuple[str, dict]] = {
    "--models": ("models", dict(help="model repository folder (default: %(default)s)")),
    "--model": (
        "only_models",
        dict(action="append", metavar="NAME", help="serve only this model of the repository (repeatable; "
             "default: every model)"),
    ),
    "--host": ("host", dict(help="interface to listen on (default: %(default)s = all)")),
    "--port": ("port", dict(type=int, help="gRPC port (default: %(default)s)")),
    "--device": ("device", dict(choices=["cpu", "cuda"], help="where the models run: cpu, or cuda (the `gpu` "
                                "extra's onnxruntime-gpu and a visible GPU) (default: %(default)s)")),
    "--io-binding": (
        "io_binding",
        dict(choices=IO_BINDING, help="keep the decoder's encoder K/V and K/V cache on the device between steps "
             "instead of copying them in at every step; auto = on for cuda, off for cpu (default: %(default)s)"),
    ),
    "--threads": ("threads", dict(type=int, help="ONNX Runtime threads per model (default: %(default)s)")),
    "--batching": (
        "batching",
        dict(choices=BATCHING_MODES, help="continuous: requests join the running batch at every decode step; "
             "window: they wait --batch-window-ms for a batch to fill (default: %(default)s)"),
    ),
    # The flag of the releases where continuous batching was opt-in, still accepted.
    "--continuous-batching": (
        "batching",
        dict(action="store_const", const="continuous", help=argparse.SUPPRESS),
    ),
    "--max-batch-size": (
        "max_batch_size",
        dict(type=int, help="most requests encoded together, admitted at one step or batched in one window "
             "(default: %(default)s)"),
    ),
    "--batch-window-ms": (
        "batch_window_ms",
        dict(type=float, help="--batching window: how long a batch waits to fill (default: %(default)s)"),
    ),
    "--max-queue-size": (
        "max_queue_size",
        dict(type=int, help="requests waiting per model; more are RESOURCE_EXHAUSTED (default: %(default)s)"),
    ),
    "--max-attention-values": (
        "max_attention_values",
        dict(type=int, help="most attention weights one response may carry; requests that could exceed it are "
             "INVALID_ARGUMENT (default: %(default)s = only the models' own limits)"),
    ),
    "--variant": (
        "variant",
        dict(help="serve each model's graphs of this manifest variant (e.g. int8) where it has one; models "
             "without it serve their default graphs"),
    ),
    "--max-beam-size": ("max_beam_size", dict(type=int, help="largest beam_size accepted (default: %(default)s)")),
    "--max-rows": (
        "max_rows",
        dict(type=int, help="--batching continuous: rows (one per beam) decoding together per model; more "
             "requests wait in the queue (default: %(default)s)"),
    ),
    "--fair-share-row-steps": (
        "fair_share_row_steps",
        dict(type=int, help="--batching continuous: rows x steps a request may spend before queued requests "
             "get its place (default: %(default)s)"),
    ),
    "--admission-hold-steps": (
        "admission_hold_steps",
        dict(type=int, help="--batching continuous: while a batch runs, hold fewer than 8 queued requests back "
             "for up to this many steps so that they are admitted together: more throughput, a later first "
             "token (default: %(default)s = admit at every step)"),
    ),
    "--inline-encoding": (
        "overlap_encoding",
        dict(action="store_false", help="--batching continuous: encode requests admitted mid-flight on the "
             "decode thread, between steps (the running rows wait for it), instead of on a second thread "
             "while the batch takes its next step"),
    ),
    "--no-length-split": (
        "length_split",
        dict(action="store_false", help="--batching continuous: pad every running row to the longest source "
             "instead of decoding requests of much longer sources in a second decoder call when the padding "
             "would cost more than that call"),
    ),
    "--engine-process": (
        "engine_process",
        dict(action="store_true", help="run each model's engine in a process of its own: the gRPC event loop "
             "and the decode loop then share no GIL (more tokens/s under many streaming clients; one more "
             "Python process per model)"),
    ),
    "--metrics-port": ("metrics_port", dict(type=int, help="serve Prometheus /metrics over HTTP on this port")),
    "--metrics-host": (
        "metrics_host",
        dict(help="interface of the metrics listener (default: %(default)s, loopback; 0.0.0.0 = all)"),
    ),
    "--grace-seconds": (
        "grace_seconds",
        dict(type=float, help="time in-flight requests get after SIGTERM/SIGINT (default: %(default)s)"),
    ),
    "--max-inflight-request-mb": (
        "max_inflight_request_mb",
        dict(type=float, help="MiB of requests handled at once; more are RESOURCE_EXHAUSTED (default: %(default)s)"),
    ),
    "--skip-broken-models": (
        "skip_broken_models",
        dict(action="store_true", help="serve the models that load; report the others NOT_SERVING"),
    ),
    "--tls-cert": ("tls_cert", dict(help="PEM certificate chain: serve TLS only (with --tls-key)")),
    "--tls-key": ("tls_key", dict(help="PEM private key of --tls-cert")),
    "--tls-client-ca": ("tls_client_ca", dict(help="PEM CA bundle: require client certificates it signed")),
    "--auth-token-file": (
        "auth_token_file",
        dict(help="require 'authorization: Bearer <token>' with a token of this file (one per line)"),
    ),
    "--log-level": ("log_level", dict(choices=logging_setup.LEVELS, help="least severe log lines written; "
                                      "debug names every request (default: %(default)s)")),
    "--log-format": ("log_format", dict(choices=logging_setup.FORMATS, help="text for people, json for log "
                                        "collectors: one object per line, ONNX Runtime's own lines included "
                                        "(default: %(default)s)")),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the flags of `attnserve serve`, with ServeOptions' defaults."""
    defaults = ServeOptions()
    for flag, (field, keywords) in _FLAGS.items():
        default = getattr(defaults, field)
        # Repeatable flags append to a list.
        parser.add_argument(flag, dest=field, default=list(default) if isinstance(default, tuple) else default,
                            **keywords)


def from_args(args: argparse.Namespace) -> ServeOptions:
    """The options of parsed flags.

    Raises:
        ValueError: a value or combination is invalid (the message names the flags).
    """
    values = {field: getattr(args, field) for field, _ in _FLAGS.values()}
    return ServeOptions(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})
