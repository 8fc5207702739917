"""Builds a word n-gram language model (server/decoding/word_lm.py) from sentences: interpolated Kneser-Ney
(Chen & Goodman 1998), one absolute discount per order, written in backoff form.

    p_n(w | h) = max(c_n(h, w) - D_n, 0) / c_n(h) + D_n T_n(h) / c_n(h) p_{n-1}(w | h')      h' = h without its oldest word
    p_0(w)     = 1 / V

c_N counts n-grams of the highest order; lower orders count the distinct words seen before an n-gram (its
continuation count), except n-grams that begin the sentence, which nothing precedes. T_n(h) is the number of
distinct words seen after h, D_n = n1 / (n1 + 2 n2) from the counts of n-grams seen once and twice. For a word
never seen after h the first term is 0, so p_n(w | h) = [D_n T_n(h) / c_n(h)] p_{n-1}(w | h'): the bracket is
h's backoff weight, and the tables keep every seen n-gram's interpolated probability and every context's
backoff weight, which the server's lookup (longest n-gram found, backoffs of the contexts passed) reproduces
exactly.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable

import numpy as np

from attnserve.server.decoding.word_lm import END, MAX_ORDER, START, WordLanguageModel, ngram_key


_NEVER = math.exp(-99.0)


def _discount(counts: collections.Counter) -> float:
    seen = collections.Counter(counts.values())
    n1, n2 = seen[1], seen[2]
    return n1 / (n1 + 2 * n2) if n1 and n2 else 0.5


def build(sentences: Iterable[str], order: int = 3) -> WordLanguageModel:
    """An order-`order` model of the sentences (words split on whitespace)."""
    if not 1 <= order <= MAX_ORDER:
        raise ValueError(f"order must be 1 to {MAX_ORDER}, got {order}")
    words: dict[str, int] = {START: 1, END: 2}
    top: collections.Counter = collections.Counter()
    for sentence in sentences:
        ids = [1] + [words.setdefault(w, len(words) + 1) for w in sentence.split()] + [2]
        for i in range(1, len(ids)):
            top[tuple(ids[max(0, i - order + 1): i + 1])] += 1  # n-grams at the start are shorter
    # counts[n]: n-gram -> the count its order uses: raw at the top order and for the n-grams that begin a
    # sentence (nothing precedes them), else the number of distinct words seen before it.
    counts = {n: collections.Counter() for n in range(1, order + 1)}
    for gram, c in top.items():
        counts[len(gram)][gram] += c
    for n in range(order, 1, -1):
        for gram in counts[n]:
            counts[n - 1][gram[1:]] += 1
    vocab_size = len(words)
    tables = {}
    probs: dict[tuple[int, ...], float] = {}
    backoff: dict[tuple[int, ...], float] = {}
    for n in range(1, order + 1):
        d = _discount(counts[n])
        context_total: collections.Counter = collections.Counter()
        followers: collections.Counter = collections.Counter()
        for gram, c in counts[n].items():
            context_total[gram[:-1]] += c
            followers[gram[:-1]] += 1
        for context, total in context_total.items():
            backoff[context] = d * followers[context] / total
        for gram, c in counts[n].items():
            lower = probs[gram[1:]] if n > 1 else 1.0 / vocab_size
            probs[gram] = max(c - d, 0.0) / context_total[gram[:-1]] + backoff[gram[:-1]] * lower
        tables[n] = sorted(counts[n])
    # START opens every sentence and is never predicted: a unigram only to hold its backoff weight.
    if order > 1:
        probs[(1,)] = _NEVER
        tables[1] = sorted({*tables[1], (1,)})
    unknown = math.log(backoff[()] / vocab_size)
    keys, log_probs, backoffs = [], [], []
    for n in range(1, order + 1):
        grams = tables[n]
        key = np.array([ngram_key(g) for g in grams], dtype=np.int64)
        index = np.argsort(key)
        keys.append(key[index])
        log_probs.append(np.array([math.log(probs[grams[i]]) for i in index], dtype=np.float32))
        backoffs.append(np.array([math.log(backoff[grams[i]]) if grams[i] in backoff else 0.0 for i in index],
                                 dtype=np.float32))
    return WordLanguageModel(sorted(words, key=words.get), keys, log_probs, backoffs, unknown)


def perplexity(model: WordLanguageModel, sentences: Iterable[str]) -> dict:
    """Per-word perplexity of the sentences (their ends counted), and the share of words outside the vocabulary."""
    total, tokens, unknown = 0.0, 0, 0
    for sentence in sentences:
        words = sentence.split()
        log_prob, oov = model.sentence_log_prob(words)
        total, tokens, unknown = total + log_prob, tokens + len(words) + 1, unknown + oov
    return {"perplexity": round(math.exp(-total / max(tokens, 1)), 1), "unknown_share": round(unknown / max(tokens, 1), 4)}
