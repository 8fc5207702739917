"""The served models: one engine per model version of a repository, opened and looked up by name.

`load_engine` opens one version (its sessions checked against the manifest, its tokenizer checked against
the decoder's logits) into a `ModelEngine`; `load_engines` opens the newest version of every model of a
repository into an `EngineRegistry`, skipping (and recording) broken ones when asked to; `open_model`
opens one model of a repository by name.
"""

from __future__ import annotations

import dataclasses

import pathlib
from collections.abc import Sequence

from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.engine import ModelEngine
from attnserve.server.engine.model_handle import logit_classes
from attnserve.server.model.repository import ModelVersion, find_models, first_intact, load_model_version, open_runtime
from attnserve.server.model.runtime import RuntimeOptions
from attnserve.server.model.tokenization import Tokenizer


class EngineRegistry:
    """The engines of every model in a repository, by name."""

    def __init__(self, engines: dict[str, ModelEngine]):
        self._engines = dict(engines)

    def get(self, name: str) -> ModelEngine:
        """The engine serving `name`.

        Raises:
            ValueError: no such model (the message lists the available ones).
        """
        try:
            return self._engines[name]
        except KeyError:
            available = ", ".join(sorted(self._engines)) or "none"
            raise ValueError(f"unknown model '{name}'; available: {available}") from None

    def names(self) -> list[str]:
        return sorted(self._engines)

    def __contains__(self, name: str) -> bool:
        return name in self._engines

    def __len__(self) -> int:
        return len(self._engines)

    def __iter__(self):
        return iter(self.names())

    def close(self, timeout: float | None = None) -> None:
        for engine in self._engines.values():
            engine.close(timeout)


def load_engine(
    model: ModelVersion,
    runtime_options: RuntimeOptions = RuntimeOptions(),
    batching: BatchingOptions = BatchingOptions(),
) -> ModelEngine:
    """Opens one model version: sessions (checked against the manifest), tokenizer, preprocessor, batcher.

    Raises:
        ValueError: a graph or the tokenizer is broken, or the model can produce ids the tokenizer lacks.
    """
    runtime = open_runtime(model, runtime_options)
    tokenizer = Tokenizer.from_manifest(model.path, model.manifest)
    classes = logit_classes(model, runtime)
    if isinstance(classes, int) and classes > tokenizer.vocab_size:
        raise ValueError(
            f"{model.decoder_path}: logits have {classes} classes but {model.tokenizer_path} has only "
            f"{tokenizer.vocab_size} tokens"
        )
    cap = model.manifest.limits.max_encoder_batch
    if cap is not None and cap < batching.max_batch_size:  # the model's own bound on one encoder call
        batching = dataclasses.replace(batching, max_batch_size=cap)
    return ModelEngine(model, runtime, tokenizer, batching)


def open_model(
    repository: str | pathlib.Path,
    name: str,
    runtime_options: RuntimeOptions = RuntimeOptions(),
    batching: BatchingOptions = BatchingOptions(),
) -> ModelEngine:
    """The newest version of one model of a repository, opened as `attnserve serve --model NAME` opens it
    (no other model is read); what export/ and bench/ use to run a served model in process.

    Raises:
        ValueError: no such model in the repository (the message lists those it has), or it is broken.
    """
    return load_engine(find_models(repository, only=[name])[name], runtime_options, batching)


def load_engines(
    repository_path: str | pathlib.Path,
    runtime_options: RuntimeOptions = RuntimeOptions(),
    batching_options: BatchingOptions = BatchingOptions(),
    broken: dict[str, str] | None = None,
    only: Sequence[str] = (),
) -> EngineRegistry:
    """Loads the newest version of every model in a repository.

    Args:
        broken: None = one broken model fails them all; a dict = broken models are skipped and recorded
            here (name -> the reason, naming the file).
        only: load these models alone; empty = every model.

    Raises:
        ValueError: the repository or (without `broken`) a model in it is broken (the message names the
            file); engines already started are closed first.
    """
    engines: dict[str, ModelEngine] = {}
    try:
        for name, model in find_models(repository_path, broken, only).items():
            try:
                # An older version stands in for a broken newest one (repository.first_intact).
                engines[name] = first_intact(
                    model.path, lambda folder: load_engine(load_model_version(folder), runtime_options, batching_options))
            except ValueError as exc:
                if broken is None:
                    raise
                broken[name] = str(exc)
    except BaseException:
        EngineRegistry(engines).close()
        raise
    return EngineRegistry(engines)
