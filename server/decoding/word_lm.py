"""A word n-gram language model in backoff form, for rescoring a recognizer's finished candidates.

A character model's beam ends with candidates that differ in a word or two ("it's the sicked big is" /
"it's the second biggest"); a word LM of much more text than the recordings' transcripts says which of them
people write. The model is a table per order n = 1..N: the sorted keys of the n-grams kept, each with its
log-probability and, as the context of longer n-grams, its backoff weight. The probability of a word after
its context is that of the longest n-gram found, times the backoff weights of the contexts passed on the
way down (Katz 1987; an interpolated Kneser-Ney model converts to this form exactly,
export/common/word_ngram_build.py). A word outside the vocabulary gets `unknown_log_prob`.

Keys: the word ids of an n-gram, oldest first, as base-2^21 digits (ids start at 1; at most 3 words fit in
an int64). Natural logarithms.
"""

from __future__ import annotations

import pathlib
from collections.abc import Collection, Sequence

import numpy as np

from attnserve.api.generation import FinishReason, ScoredSequence
from attnserve.server.decoding.ngram_lm import read_tables

FORMAT = "attnserve-word-ngram-1"
START, END = "<s>", "</s>"
ID_BITS = 21
MAX_ORDER = 3  # 3 x 21 bits of word ids in an int64 key
MAX_WORDS = (1 << ID_BITS) - 1


def ngram_key(ids: Sequence[int]) -> int:
    key = 0
    for i in ids:
        key = (key << ID_BITS) | i
    return key


class WordLanguageModel:
    """Backoff n-gram tables over words; `load` reads one, `sentence_log_prob` scores a transcript.

    Args:
        words: the vocabulary, START and END included; a word's id is its index + 1.
        keys, log_probs, backoffs: per order n (index n - 1), the sorted (m_n,) int64 keys of its n-grams,
            their log p(last word | the others), and their backoff weights as a context (0 for the longest).
        unknown_log_prob: log p of a word outside the vocabulary, whatever its context.
    """

    def __init__(self, words: Sequence[str], keys: Sequence[np.ndarray], log_probs: Sequence[np.ndarray],
                 backoffs: Sequence[np.ndarray], unknown_log_prob: float):
        if not 1 <= len(keys) <= MAX_ORDER or not len(keys) == len(log_probs) == len(backoffs):
            raise ValueError(f"a word LM needs 1 to {MAX_ORDER} orders, each with keys, log-probabilities and backoffs")
        if len(words) > MAX_WORDS or START not in words or END not in words:
            raise ValueError(f"a word LM's vocabulary holds at most {MAX_WORDS} words, {START} and {END} among them")
        self.ids = {w: i + 1 for i, w in enumerate(words)}
        self.keys = [np.asarray(k, dtype=np.int64) for k in keys]
        self.log_probs = [np.asarray(p, dtype=np.float32) for p in log_probs]
        self.backoffs = [np.asarray(b, dtype=np.float32) for b in backoffs]
        if any(len(k) != len(p) or len(k) != len(b) for k, p, b in zip(self.keys, self.log_probs, self.backoffs)):
            raise ValueError("a word LM's tables need one log-probability and one backoff per key")
        self.order = len(keys)
        self.unknown_log_prob = float(unknown_log_prob)

    @classmethod
    def load(cls, path: str | pathlib.Path) -> WordLanguageModel:
        """Reads a file written by `save`.

        Raises:
            ValueError: the file is missing, unreadable or inconsistent; the message names it.
        """
        return read_tables(pathlib.Path(path), FORMAT, "word language model", lambda data, order: cls(
            str(data["words"]).split("\n"), [data[f"keys_{n}"] for n in range(order)],
            [data[f"log_probs_{n}"] for n in range(order)], [data[f"backoffs_{n}"] for n in range(order)],
            float(data["unknown_log_prob"])))

    def save(self, path: str | pathlib.Path) -> None:
        words = sorted(self.ids, key=self.ids.get)
        tables = {}
        for n in range(self.order):
            tables[f"keys_{n}"] = self.keys[n]
            tables[f"log_probs_{n}"] = self.log_probs[n].astype(np.float16)
            tables[f"backoffs_{n}"] = self.backoffs[n].astype(np.float16)
        np.savez_compressed(path, format=np.array(FORMAT), order=np.array(self.order), words=np.array("\n".join(words)),
                            unknown_log_prob=np.array(self.unknown_log_prob), **tables)

    def _find(self, ids: Sequence[int]) -> int | None:
        table = self.keys[len(ids) - 1]
        key = ngram_key(ids)
        i = int(np.searchsorted(table, key))
        return i if i < len(table) and table[i] == key else None

    def word_log_prob(self, context: Sequence[int], word: int) -> float:
        """log p(word | the last order - 1 ids of context); `word` is an id of the vocabulary."""
        context = list(context[len(context) - (self.order - 1):]) if self.order > 1 else []
        backoff = 0.0
        while True:
            found = self._find([*context, word])
            if found is not None:
                return backoff + float(self.log_probs[len(context)][found])
            if not context:
                return backoff + self.unknown_log_prob  # an id without a unigram: not in the model
            held = self._find(context)
            if held is not None:
                backoff += float(self.backoffs[len(context) - 1][held])
            context = context[1:]

    def sentence_log_prob(self, words: Sequence[str], free: Collection[str] = ()) -> tuple[float, int]:
        """(log p of the words and the sentence's end after START, how many words are not in the vocabulary).

        Words in `free` (a request's hotwords: it says they are spoken) cost nothing, and the words after one
        are scored without it, as after a word the model does not know.
        """
        history, total, unknown = [self.ids[START]], 0.0, 0
        for w in [*words, END]:
            i = self.ids.get(w)
            if w in free:
                i = 0
            elif i is None:
                total += self.unknown_log_prob
                unknown += 1
                i = 0  # no n-gram holds id 0: the next words back off past it
            else:
                total += self.word_log_prob(history, i)
            history.append(i)
        return total, unknown


class WordRescorer:
    """Ranks a beam's finished candidates by their summed log-probability + weight x the word LM's
    log-probability of their words + word_bonus x their words - unknown_penalty x their words outside the LM
    (the bonus offsets the LM's cost per word, which would favour short outputs)."""

    def __init__(self, model: WordLanguageModel, weight: float, word_bonus: float, unknown_penalty: float):
        self.model, self.weight, self.word_bonus, self.unknown_penalty = model, weight, word_bonus, unknown_penalty

    def score(self, candidate: ScoredSequence, hotwords: Collection[str] = ()) -> float:
        """The candidate's rank; its `hotwords` (the request's) cost nothing in the LM."""
        words = candidate.text.split()
        log_prob, unknown = self.model.sentence_log_prob(words, hotwords)
        return (summed_log_prob(candidate) + self.weight * log_prob + self.word_bonus * len(words)
                - self.unknown_penalty * unknown)


def summed_log_prob(candidate: ScoredSequence) -> float:
    """A candidate's log-probability, its end included (its score is the mean over its tokens and EOS)."""
    return candidate.score * max(len(candidate.tokens) + (candidate.finish_reason is FinishReason.EOS), 1)
