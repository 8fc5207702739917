"""A token n-gram language model for shallow fusion: each step's candidates also scored by how likely the
LM finds them after the row's previous tokens (Gulcehre et al. 2015; Chorowski & Jaitly 2017 for speech).

The model is a table per context length k = 0..order-1: the sorted keys of the contexts kept and, for each,
the log-probabilities of every next token (already interpolated with the shorter contexts when it was built,
export/speech/language_model.py). A row's distribution is that of its longest context found in the tables,
so scoring a step is one binary search per context length for the whole batch, and a row's only state is its
last order-1 tokens.

Context keys: a context's tokens, newest first, as base-(V+1) digits of (token id + 1); digit 0 stands for
"before the start", so the first tokens of a sequence have contexts as short as what came before them, and
the decoder start token opens every context.
"""

from __future__ import annotations

import pathlib

import numpy as np

FORMAT = "attnserve-ngram-1"


def read_tables(path: pathlib.Path, expected_format: str, what: str, read):
    """`read(data, order)` of an LM's .npz file, whose `format` must be `expected_format`.

    Raises:
        ValueError: the file is missing or unreadable, or is not one; the message names it and `what` it is not.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            if str(data["format"]) != expected_format:
                raise ValueError(f"format {str(data['format'])!r}, expected {expected_format!r}")
            return read(data, int(data["order"]))
    except (OSError, KeyError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable {what}: {exc}") from exc


class NgramLanguageModel:
    """Log-probability tables of an n-gram LM over a decoder's token ids; `load` reads one.

    Args:
        keys: per context length k, the (n_k,) sorted int64 keys of its contexts (k = 0: one key, 0).
        log_probs: per context length k, (n_k, V) float log p(next token | context).
    """

    def __init__(self, keys: list[np.ndarray], log_probs: list[np.ndarray]):
        if len(keys) != len(log_probs) or not keys:
            raise ValueError("an n-gram LM needs one key table and one log-probability table per context length")
        self.keys = [np.asarray(k, dtype=np.int64) for k in keys]
        self.log_probs = [np.asarray(lp, dtype=np.float32) for lp in log_probs]
        self.vocab_size = self.log_probs[0].shape[1]
        self.order = len(keys)  # contexts of up to order - 1 tokens
        self._powers = (self.vocab_size + 1) ** np.arange(max(self.order - 1, 1), dtype=np.int64)

    @classmethod
    def load(cls, path: str | pathlib.Path) -> NgramLanguageModel:
        """Reads an LM file (numpy .npz written by `save`).

        Raises:
            ValueError: the file is missing, unreadable or inconsistent; the message names it.
        """
        path = pathlib.Path(path)
        keys, log_probs = read_tables(path, FORMAT, "n-gram language model", lambda data, order: (
            [data[f"keys_{k}"] for k in range(order)], [data[f"log_probs_{k}"] for k in range(order)]))
        vocab = {lp.shape[1] if lp.ndim == 2 else None for lp in log_probs}
        if len(vocab) != 1 or any(len(k) != len(lp) for k, lp in zip(keys, log_probs)) or len(keys[0]) != 1:
            raise ValueError(f"{path}: inconsistent n-gram tables (one row per key, one vocabulary, one empty context)")
        return cls(keys, log_probs)

    def save(self, path: str | pathlib.Path) -> None:
        tables = {}
        for k, (keys, lp) in enumerate(zip(self.keys, self.log_probs)):
            tables[f"keys_{k}"], tables[f"log_probs_{k}"] = keys, lp.astype(np.float16)
        np.savez(path, format=np.array(FORMAT), order=np.array(self.order), **tables)

    def context_keys(self, history: np.ndarray, length: int) -> np.ndarray:
        """(B,) keys of each row's last `length` tokens; `history` is (B, order - 1) of (token id + 1),
        newest last, 0 before the start."""
        if length == 0:
            return np.zeros(len(history), dtype=np.int64)
        newest_first = history[:, ::-1][:, :length]
        return newest_first @ self._powers[:length]

    def score(self, history: np.ndarray) -> np.ndarray:
        """(B, V) log p(next token) for each row, from its longest context in the tables."""
        out = np.repeat(self.log_probs[0][:1], len(history), axis=0)
        for length in range(1, self.order):
            keys = self.context_keys(history, length)
            table = self.keys[length]
            if not len(table):
                break
            index = np.minimum(np.searchsorted(table, keys), len(table) - 1)
            found = table[index] == keys
            if not found.any():
                break  # a longer context contains this one, so none of those is in the tables either
            out[found] = self.log_probs[length][index[found]]
        return out


class LanguageModelState:
    """Each row's last order-1 tokens, for scoring its next one; gathered and merged with the batch's rows."""

    def __init__(self, model: NgramLanguageModel, history: np.ndarray):
        self.model = model
        self.history = history  # (B, order - 1) token id + 1, newest last; 0 before the start

    @classmethod
    def start(cls, model: NgramLanguageModel, rows: int) -> LanguageModelState:
        """Rows with no tokens yet: the first one each is given is the decoder's start token."""
        return cls(model, np.zeros((rows, max(model.order - 1, 1)), dtype=np.int64))

    def advance(self, tokens: np.ndarray) -> None:
        """Appends each row's newest token (B,), the decoder start token first."""
        self.history = np.concatenate([self.history[:, 1:], np.asarray(tokens, dtype=np.int64).reshape(-1, 1) + 1], axis=1)

    def score(self) -> np.ndarray:
        return self.model.score(self.history)

    def select(self, rows: np.ndarray) -> None:
        self.history = self.history[rows]

    @staticmethod
    def concatenate(states: list[LanguageModelState]) -> LanguageModelState:
        return LanguageModelState(states[0].model, np.concatenate([s.history for s in states]))
