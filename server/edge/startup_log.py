"""What `serve` tells an operator once it listens: each model and what runs it, where metrics are, the limits.

One line per model (name, version, variant, task, execution provider, beam and token limits, request bytes),
one for the metrics listener, one for the server-wide limits, and the ONNX Runtime and attnserve versions, so
that the first screen of a log answers "what is this server running, and with which bounds".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

logger = logging.getLogger("attnserve.startup")


def log_start(engines: Mapping[str, object], options) -> None:
    """Logs the start report.

    Args:
        engines: model name -> engine (its `info`, and `providers` when it has them).
        options: the ServeOptions the server runs with.
    """
    logger.info("attnserve %s, ONNX Runtime %s, device %s, batching %s", _version(), _ort_version(),
                options.device, options.batching)
    for name in sorted(engines):
        engine = engines[name]
        info = engine.info
        providers = getattr(engine, "providers", None) or ["(unknown)"]
        logger.info(
            "model %s version %d%s: %s, %s, provider %s, max_beam_size %d (default %d), max_new_tokens %d, "
            "max_request_bytes %d", info.name, info.version, f" variant {info.variant}" if info.variant else "",
            info.task, info.input_kind.value, providers[0], info.max_beam_size, info.default_beam_size,
            info.max_new_tokens, info.max_request_bytes,
        )
    if options.metrics_port is None:
        logger.info("metrics: off (--metrics-port serves Prometheus /metrics)")
    else:
        logger.info("metrics: http://%s:%d/metrics", options.metrics_host, options.metrics_port)
    logger.info(
        "limits: max_queue_size %d per model, max_batch_size %d, max_rows %d, max_inflight_request_mb %g, "
        "max_attention_values %d, grace_seconds %g, auth %s, tls %s",
        options.max_queue_size, options.max_batch_size, options.max_rows, options.max_inflight_request_mb,
        options.max_attention_values, options.grace_seconds, "token" if options.auth_token_file else "off",
        "on" if options.tls_cert else "off",
    )


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("attnserve")
    except metadata.PackageNotFoundError:
        return "(not installed)"


def _ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__
