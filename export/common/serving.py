"""An exported version folder opened as `attnserve serve` opens it, for the families' evaluation scripts."""

from __future__ import annotations

import pathlib


def open_engine(model_dir: pathlib.Path, max_batch: int = 16):
    """The model of a version folder (models/<name>/<version>), loaded as `attnserve serve` loads it."""
    # Imported here: the server's engine is only needed when a script evaluates a served model.
    from attnserve.server.engine.batcher import BatchingOptions
    from attnserve.server.engine.registry import load_engine
    from attnserve.server.model.repository import find_models

    name = model_dir.parent.name
    models = find_models(model_dir.parent.parent)
    if models[name].path.resolve() != model_dir.resolve():
        raise ValueError(f"{model_dir} is not the newest version of {name}; the server would serve {models[name].path}")
    return load_engine(models[name], batching=BatchingOptions(max_batch_size=max_batch, window_ms=50.0))
