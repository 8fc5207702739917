"""Logit processors: the model's own changes to a step's logits, applied in one ordered list.

A model's manifest can ask for three changes to what its decoder scores, before any strategy chooses:

1. `JointCTC` (manifest encoder.ctc): the logits become joint CTC/attention scores (server/decoding/ctc_prefix.py);
2. `LanguageModelFusion` (manifest language_model): the n-gram LM's log-probabilities are added (shallow
   fusion, server/decoding/ngram_lm.py);
3. `SuppressTokens` (manifest special_tokens.suppress): tokens the model must never emit get -inf.

`processors_for` builds the list in that order, and `Batch.step` (server/decoding/batch.py) runs each one on the
step's logits, so every strategy ranks candidates by all of them (as whisper's `logit_filters`). A request's
own rules (minimum length, repetition guard: server/decoding/output_rules.py) are applied later by its strategy:
rows of one running batch belong to different strategies, and only a strategy knows its rows' requests.

Processors that score with per-row state (CTC prefixes, LM history) keep it themselves and follow the
batch's rows through the same three row operations (select, copy, concatenate), so the batch never
asks which kinds it holds.
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Mapping, Sequence
from typing import Self

import numpy as np

from attnserve.server.decoding.ctc_prefix import CTCPrefixScorer
from attnserve.server.decoding.log_softmax import log_softmax
from attnserve.server.model.manifest import Manifest
from attnserve.server.decoding.ngram_lm import LanguageModelState, NgramLanguageModel


class LogitProcessor(abc.ABC):
    """One change to every row's (B, V) logits, with the per-row state it needs (none by default).

    The row operations follow the batch's: `select` as rows finish or beams are reordered, `copy` when a
    batch splits in two (each side then selects its own rows), `concatenate` when batches merge.
    """

    def advance(self, tokens: np.ndarray, positions: np.ndarray) -> None:
        """Sees the tokens (B,) the rows are fed this step, at positions (B,), before the decoder call."""

    @abc.abstractmethod
    def __call__(self, logits: np.ndarray) -> np.ndarray:
        """(B, V) logits -> (B, V) changed logits (possibly the same array, changed in place)."""

    def select(self, rows: np.ndarray) -> None:
        """Keeps the given rows (B',) in the given order; a row may appear more than once (beam search)."""

    def copy(self) -> Self:
        """An independent copy (stateless processors are shared)."""
        return self

    @classmethod
    def concatenate(cls, parts: Sequence[Self]) -> Self:
        """One processor over every part's rows, in order."""
        return parts[0]


class _WeightedScores(LogitProcessor):
    """A processor that adds `weight` x scores from a per-row state (a CTC scorer, an LM's history)."""

    def __init__(self, weight: float, state):
        self.weight = weight
        self.state = state  # has select(rows), and concatenate(parts) on its class

    def select(self, rows: np.ndarray) -> None:
        self.state.select(rows)

    def copy(self) -> Self:
        return type(self)(self.weight, copy.copy(self.state))

    @classmethod
    def concatenate(cls, parts: Sequence[Self]) -> Self:
        return cls(parts[0].weight, type(parts[0].state).concatenate([p.state for p in parts]))


class JointCTC(_WeightedScores):
    """(1 - w) log p_decoder + w x CTC prefix score of each extension (Watanabe et al. 2017); the state is a
    `CTCPrefixScorer`.

    Strategies normalise the joint scores like any logits. A row whose every extension the CTC head rules
    out (more characters than its frames can hold) keeps its decoder scores.
    """

    def advance(self, tokens: np.ndarray, positions: np.ndarray) -> None:
        # The tokens chosen last step extend the CTC prefixes (not the start token, at position 0).
        self.state.advance(tokens, np.flatnonzero(positions > 0))

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        w = self.weight
        ctc = self.state.score()  # (B, V)
        joint = (1 - w) * log_softmax(logits) + w * ctc
        stuck = ~np.isfinite(joint.max(axis=-1))
        joint[stuck] = logits[stuck]
        return joint.astype(np.float32, copy=False)


class LanguageModelFusion(_WeightedScores):
    """(B, V) decoder (or joint) scores -> their log-probabilities + weight x the LM's log p of each token
    after the row's tokens so far (shallow fusion); the state is a `LanguageModelState`."""

    def advance(self, tokens: np.ndarray, positions: np.ndarray) -> None:
        self.state.advance(tokens)  # the LM's context includes the start token

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        fused = log_softmax(logits) + self.weight * self.state.score()
        return fused.astype(np.float32, copy=False)


class SuppressTokens(LogitProcessor):
    """Tokens the model must never emit get -inf, in place (log-probabilities are those of what remains)."""

    def __init__(self, ids: Sequence[int]):
        self.ids = list(ids)

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        logits[:, self.ids] = -np.inf
        return logits


def processors_for(manifest: Manifest, encoded: Mapping[str, np.ndarray], rows: int,
                   language_model: NgramLanguageModel | None) -> list[LogitProcessor]:
    """The processors a model's manifest asks for, in the order they apply, for a freshly encoded batch.

    Args:
        encoded: the encoder's feeds and outputs (the CTC head's log-probabilities and lengths among them).
        rows: the batch's rows, one per source.
        language_model: the manifest's LM (loaded), when it names one.
    """
    out: list[LogitProcessor] = []
    ctc = manifest.encoder.ctc
    if ctc is not None and ctc.weight > 0:
        scorer = CTCPrefixScorer(encoded[ctc.log_probs], encoded[ctc.lengths], ctc.blank_id,
                                 manifest.special_tokens.eos)
        out.append(JointCTC(ctc.weight, scorer))
    lm = manifest.language_model
    if language_model is not None and lm is not None and lm.weight > 0:
        out.append(LanguageModelFusion(lm.weight, LanguageModelState.start(language_model, rows)))
    if manifest.special_tokens.suppress:
        out.append(SuppressTokens(manifest.special_tokens.suppress))
    return out
