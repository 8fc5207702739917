"""What the worker loops need of a served model, and nothing more.

The continuous loop (server/engine/continuous.py) and the windowed driver (server/engine/windowed.py) encode sources
into a fresh `Batch`, start a search strategy over prepared requests, and size their scheduling by what a
decoder call reads. A `ModelHandle` gives them exactly that, so neither reaches into the engine that owns
them (which validates, queues and cancels: server/engine/engine.py) and the engine imports them, never the
other way round.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from attnserve.server.decoding.batch import Batch
from attnserve.server.decoding.decoding import make_strategy
from attnserve.server.model.manifest import Manifest
from attnserve.server.decoding.ngram_lm import NgramLanguageModel
from attnserve.server.decoding.prepared import PreparedRequest
from attnserve.server.inputs.preprocessing import Preprocessor, Source
from attnserve.server.model.repository import ModelVersion
from attnserve.server.model.runtime import Runtime
from attnserve.server.decoding.search import DecodeStrategy


@dataclasses.dataclass(frozen=True)
class ModelHandle:
    """One model version's encoder, decoder and search, as the worker loops call them."""

    manifest: Manifest
    runtime: Runtime
    preprocessor: Preprocessor
    # The manifest's n-gram LM for shallow fusion (loaded), or None.
    language_model: NgramLanguageModel | None = None

    @classmethod
    def open(cls, model: ModelVersion, runtime: Runtime, preprocessor: Preprocessor) -> ModelHandle:
        """The handle of a model whose sessions are open; loads the LM its manifest names.

        Raises:
            ValueError: the LM file is unreadable, or its vocabulary is not the decoder's.
        """
        return cls(model.manifest, runtime, preprocessor, _open_language_model(model, runtime))

    @property
    def eos(self) -> int:
        return self.manifest.special_tokens.eos

    @property
    def decoder_bytes(self) -> int:
        """The decoder graph's size: about what one decoder call reads of weights (the scheduler's measure)."""
        return self.runtime.decoder_bytes

    def encode(self, sources: Sequence[Source]) -> Batch:
        """Runs the encoder over `sources` together: a fresh batch, one row per source."""
        return Batch.build(self.manifest, self.runtime, self.preprocessor.collate(sources), self.language_model)

    def strategy(self, requests: Sequence[PreparedRequest], length_budget: np.ndarray | None) -> DecodeStrategy:
        """The search of requests that share one beam size (see decoding.make_strategy)."""
        return make_strategy(requests, self.eos, length_budget)


def logit_classes(model: ModelVersion, runtime: Runtime) -> int | str | None:
    """How many classes the decoder's logits have: a size, or the symbolic name of a dynamic axis."""
    return runtime.decoder_signature.outputs[model.manifest.decoder.logits].shape[-1]


def _open_language_model(model: ModelVersion, runtime: Runtime) -> NgramLanguageModel | None:
    """The manifest's LM for shallow fusion, or None.

    Raises:
        ValueError: the file is unreadable, or its vocabulary is not the decoder's.
    """
    spec = model.manifest.language_model
    if spec is None:
        return None
    lm = NgramLanguageModel.load(model.path / spec.file)
    classes = logit_classes(model, runtime)
    if isinstance(classes, int) and classes != lm.vocab_size:
        raise ValueError(f"{model.path / spec.file}: the language model scores {lm.vocab_size} tokens, the decoder "
                         f"{classes}")
    return lm
