"""The options of `attnserve serve`: one frozen dataclass, its flags, and the engine options it sets.

The config tree: `ServeOptions` holds the server process's own options (listener, TLS, logging, ...) and
one field per engine option it exposes as a flag. Those mirror `RuntimeOptions` (how sessions run),
`BatchingOptions` (queue, batch size, window) and `SchedulingOptions` (continuous batching), which stay the
one home of their defaults and bounds (server/model/option_fields.py); `runtime_options()` and
`batching_options()` build them. The CLI builds its flags from the dataclass (`add_arguments`), so the
defaults the help shows are the ones the server uses; errors name the flag a user typed, not a field name.
Nothing here imports onnxruntime.
"""

from __future__ import annotations

import argparse
import dataclasses

from attnserve.api import convert
from attnserve.server.edge import logging_setup
from attnserve.server.edge.intake import IntakeOptions
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.longform import LongFormOptions
from attnserve.server.model.option_fields import bounded, mirror, problems
from attnserve.server.model.runtime_options import DEVICES, RuntimeOptions
from attnserve.server.engine.scheduler import SchedulingOptions

LOOPBACK = "127.0.0.1"
# How a worker batches requests: "continuous" admits them into the running batch at every decode step
# (server/engine/continuous.py); "window" waits --batch-window-ms for a batch to fill, and a batch admits no one
# once it runs (server/engine/batcher.py).
BATCHING_MODES = ("continuous", "window")
# --io-binding -> RuntimeOptions.io_binding.
IO_BINDING = {"auto": None, "on": True, "off": False}


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    models: str = "models"  # model repository folder
    # Serve only these models of the repository (e.g. one model per deployment); empty = every model.
    only_models: tuple[str, ...] = ()
    # Interface to listen on. Loopback by default: without --tls-cert and --auth-token-file the port is
    # plaintext and open to anyone who reaches it, so listening on others ("0.0.0.0", "[::]") is a choice
    # to make explicitly (the container image and the manifests make it).
    host: str = LOOPBACK
    port: int = bounded(convert.DEFAULT_PORT, least=0, most=65535)  # 0 = any free port (gRPC would wrap 65536+)
    device: str = mirror(RuntimeOptions, "device")  # "cpu" or "cuda"
    # Keep decoder inputs (encoder K/V, the K/V cache) on the device between steps: "auto" = on for cuda.
    io_binding: str = bounded("auto", choices=IO_BINDING)
    threads: int = mirror(RuntimeOptions, "intra_op_threads")  # ONNX Runtime intra-op threads per model
    batching: str = bounded("continuous", choices=BATCHING_MODES)
    # Most requests that start together in one encoder call: admitted at one step, or one windowed batch.
    max_batch_size: int = mirror(BatchingOptions, "max_batch_size")
    batch_window_ms: float = mirror(BatchingOptions, "window_ms")  # --batching window: wait for more requests
    max_queue_size: int = mirror(BatchingOptions, "max_queue_size")  # per model; more are RESOURCE_EXHAUSTED
    max_attention_values: int = mirror(BatchingOptions, "max_attention_values")  # per response; 0 = models' own
    max_beam_size: int = mirror(BatchingOptions, "max_beam_size")  # largest beam_size a request may ask for
    variant: str | None = mirror(RuntimeOptions, "variant")  # each model's graphs of this variant, where it has one
    max_rows: int = mirror(SchedulingOptions, "max_rows")  # continuous batching: rows decoding together per model
    fair_share_row_steps: int = mirror(SchedulingOptions, "fair_share_row_steps")  # rows x steps, then yield
    admission_hold_steps: int = mirror(SchedulingOptions, "admission_hold_steps")  # steps waiting for company
    # Continuous batching: encode requests admitted mid-flight on a second thread while the batch steps.
    overlap_encoding: bool = mirror(SchedulingOptions, "overlap_encoding")
    # Continuous batching: decode requests of much longer sources in a second lane when padding costs more.
    length_split: bool = mirror(SchedulingOptions, "length_split")
    # Run each model's engine in a child process, so that the gRPC loop and the decode loop share no GIL.
    engine_process: bool = False
    metrics_port: int | None = bounded(None, least=0, most=65535)  # serve Prometheus /metrics over HTTP; None = don't
    # Interface of the metrics listener. Loopback by default, whatever --host says: metrics name the models
    # and show the traffic, so exposing them is a separate, explicit choice.
    metrics_host: str = LOOPBACK
    grace_seconds: float = bounded(10.0, least=0)  # how long in-flight requests may finish after a shutdown signal
    # Bytes of requests handled at once (audio and images are the big ones); more are RESOURCE_EXHAUSTED.
    max_inflight_request_mb: float = bounded(256.0, above=0)
    # Threads per model that validate and decode inputs (server/edge/intake.py), and requests per model waiting
    # for them; more are RESOURCE_EXHAUSTED.
    preprocess_threads: int = mirror(IntakeOptions, "workers")
    max_preprocess_queue: int = mirror(IntakeOptions, "max_queued")
    # MiB per model that inputs being preprocessed decode to (pixels x channels, samples x 4), read from
    # their headers before decoding; more are RESOURCE_EXHAUSTED.
    max_decoded_mb: float = bounded(512.0, above=0)
    # Refuse at once (RESOURCE_EXHAUSTED, with a retry hint) a request its model cannot finish before its
    # deadline, estimated from the work ahead of it and its own (server/engine/cost.py).
    deadline_admission: bool = True
    # Audio models: recordings longer than the model's window, up to this long, are cut at pauses and
    # transcribed segment by segment (server/engine/longform.py); 0 = the window is the limit.
    long_form_max_minutes: float = bounded(60.0, least=0)
    # Long recordings per model decoding or transcribed at once (each holds its samples); more are
    # RESOURCE_EXHAUSTED.
    max_long_form_recordings: int = mirror(LongFormOptions, "max_recordings")
    # Of those, the most one client (its bearer token with --auth-token-file, else its IP address) may have.
    max_long_form_recordings_per_client: int = mirror(LongFormOptions, "max_recordings_per_client")
    skip_broken_models: bool = False  # serve the healthy models when some fail to load (those: NOT_SERVING)
    tls_cert: str | None = None  # PEM certificate chain; with tls_key the port speaks TLS only
    tls_key: str | None = None  # PEM private key
    tls_client_ca: str | None = None  # PEM CA bundle: clients must present a certificate it signed
    auth_token_file: str | None = None  # accepted bearer tokens, one per line; None = no authentication
    log_level: str = bounded("info", choices=logging_setup.LEVELS)  # debug, info, warning, error
    log_format: str = bounded("text", choices=logging_setup.FORMATS)  # text or json (one object per line)

    def __post_init__(self):
        found = [*problems(self, label=_flag), *_conflicts(self)]
        if found:
            raise ValueError("; ".join(found))

    def runtime_options(self) -> RuntimeOptions:
        """How each model's sessions run."""
        return RuntimeOptions(device=self.device, intra_op_threads=self.threads, variant=self.variant,
                              io_binding=IO_BINDING[self.io_binding])

    def batching_options(self) -> BatchingOptions:
        """Each model's queue and batching (continuous: with its scheduling)."""
        scheduling = SchedulingOptions(
            max_rows=self.max_rows, fair_share_row_steps=self.fair_share_row_steps,
            admission_hold_steps=self.admission_hold_steps, overlap_encoding=self.overlap_encoding,
            length_split=self.length_split,
        )
        return BatchingOptions(
            max_batch_size=self.max_batch_size, window_ms=self.batch_window_ms, max_queue_size=self.max_queue_size,
            max_attention_values=self.max_attention_values, max_beam_size=self.max_beam_size,
            continuous=scheduling if self.batching == "continuous" else None,
        )


def _conflicts(o: ServeOptions):
    """Every invalid combination of flags (single values are checked against their fields' bounds)."""
    if o.batching == "continuous" and o.max_beam_size > o.max_rows:
        yield f"--max-beam-size {o.max_beam_size} needs --max-rows of at least as many, got {o.max_rows}"
    if (o.tls_cert is None) != (o.tls_key is None):
        yield "--tls-cert and --tls-key go together: give both or neither"
    if o.tls_client_ca is not None and o.tls_cert is None:
        yield "--tls-client-ca needs --tls-cert and --tls-key (client certificates are checked over TLS)"
    if o.max_long_form_recordings_per_client > o.max_long_form_recordings:
        yield (f"--max-long-form-recordings-per-client {o.max_long_form_recordings_per_client} is more than "
               f"--max-long-form-recordings {o.max_long_form_recordings}: lower it too")


def _flag(field: str) -> str:
    """The flag that sets a field (its first, where two do)."""
    return next(flag for flag, (name, _) in _FLAGS.items() if name == field)


# Flag -> (field, argparse keywords). The help text of each flag shows the dataclass default.
_FLAGS: dict[str, tuple[str, dict]] = {
    "--models": ("models", dict(help="model repository folder (default: %(default)s)")),
    "--model": (
        "only_models",
        dict(action="append", metavar="NAME", help="serve only this model of the repository (repeatable; "
             "default: every model)"),
    ),
    "--host": ("host", dict(help="interface to listen on (default: %(default)s, loopback; 0.0.0.0 = every IPv4 "
                             "interface, [::] = every interface)")),
    "--port": ("port", dict(type=int, help="gRPC port (default: %(default)s)")),
    "--device": ("device", dict(choices=DEVICES, help="where the models run: cpu, or cuda (the `gpu` extra's "
                                "onnxruntime-gpu and a visible GPU) (default: %(default)s)")),
    "--io-binding": (
        "io_binding",
        dict(choices=IO_BINDING, help="keep the decoder's encoder K/V and K/V cache on the device between steps "
             "instead of copying them in at every step; auto = on for cuda, off for cpu (default: %(default)s)"),
    ),
    "--threads": ("threads", dict(type=int, help="ONNX Runtime threads per model; 0 = ONNX Runtime's default "
                                   "(default: %(default)s)")),
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
    "--preprocess-threads": (
        "preprocess_threads",
        dict(type=int, help="threads per model that validate and decode inputs (default: %(default)s)"),
    ),
    "--max-preprocess-queue": (
        "max_preprocess_queue",
        dict(type=int, help="requests per model waiting for preprocessing; more are RESOURCE_EXHAUSTED "
             "(default: %(default)s)"),
    ),
    "--max-decoded-mb": (
        "max_decoded_mb",
        dict(type=float, help="MiB per model that inputs being preprocessed decode to (pixels x channels, "
             "frames x pixels x 3, samples x 4, from their headers); more are RESOURCE_EXHAUSTED "
             "(default: %(default)s)"),
    ),
    "--no-deadline-admission": (
        "deadline_admission",
        dict(action="store_false", help="admit every request whatever its deadline, instead of refusing at once "
             "(RESOURCE_EXHAUSTED, with a retry hint) what its model cannot finish in time"),
    ),
    "--long-form-max-minutes": (
        "long_form_max_minutes",
        dict(type=float, help="audio models: transcribe recordings longer than the model's window, up to this "
             "many minutes, cut at pauses (default: %(default)s; 0 = refuse them)"),
    ),
    "--max-long-form-recordings": (
        "max_long_form_recordings",
        dict(type=int, help="audio models: long recordings decoded or transcribed at once, per model (each holds "
             "its samples); more are RESOURCE_EXHAUSTED (default: %(default)s)"),
    ),
    "--max-long-form-recordings-per-client": (
        "max_long_form_recordings_per_client",
        dict(type=int, help="audio models: long recordings one client (its bearer token, else its IP address) "
             "may have decoded or transcribed at once, per model; at most --max-long-form-recordings; more are "
             "RESOURCE_EXHAUSTED (default: %(default)s)"),
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
