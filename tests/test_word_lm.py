"""The word n-gram LM (server/decoding/word_lm.py, export/common/word_ngram_build.py): the backoff tables the
server reads give the interpolated Kneser-Ney probabilities they were built from, every context's
distribution sums to one, and the rescorer adds what its manifest says."""

from __future__ import annotations

import collections
import json
import math
import os
import pathlib
import random

import numpy as np
import pytest

from attnserve.api.generation import FinishReason, ScoredSequence, Token
from attnserve.export.common.word_ngram_build import build, perplexity
from attnserve.server.decoding.word_lm import END, START, WordLanguageModel, WordRescorer, summed_log_prob
from attnserve.server.model.manifest import parse_manifest

REPOSITORY = pathlib.Path(os.environ.get("ATTNSERVE_BUNDLED_MODELS", pathlib.Path(__file__).parents[1] / "models"))


def _sentences(count: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = "the cat dog sat on a mat and ran to it was".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(1, 7))) for _ in range(count)]


def _reference_kneser_ney(sentences: list[str], order: int):
    """p(w | h), interpolated Kneser-Ney written as its recursion over counts (no backoff tables)."""
    windows = {n: collections.Counter() for n in range(1, order + 1)}
    for s in sentences:
        words = [START, *s.split(), END]
        for n in windows:
            for i in range(len(words) - n + 1):
                windows[n][tuple(words[i: i + n])] += 1
    left = collections.defaultdict(set)  # n-gram -> the distinct words seen right before it
    for n in range(2, order + 1):
        for gram in windows[n]:
            left[gram[1:]].add(gram[0])
    # Raw counts at the top order and for n-grams that open a sentence; else how many words precede it.
    counts = {n: collections.Counter({g: c if n == order or g[0] == START else len(left[g])
                                      for g, c in windows[n].items() if g != (START,)})
              for n in range(1, order + 1)}
    discount = {}
    for n, table in counts.items():
        seen = collections.Counter(table.values())
        discount[n] = seen[1] / (seen[1] + 2 * seen[2]) if seen[1] and seen[2] else 0.5  # the builder's rule
    vocabulary = {w for s in sentences for w in s.split()} | {START, END}

    def p(history: tuple[str, ...], word: str) -> float:
        n = len(history) + 1
        lower = p(history[1:], word) if history else 1.0 / len(vocabulary)
        followers = {g: c for g, c in counts[n].items() if g[:-1] == history}
        total = sum(followers.values())
        if not total:
            return lower
        d = discount[n]
        return max(followers.get((*history, word), 0) - d, 0) / total + d * len(followers) / total * lower

    return p


@pytest.mark.parametrize("order", [1, 2, 3])
def test_the_backoff_tables_give_the_interpolated_kneser_ney_probabilities(order):
    sentences = _sentences()
    model, reference = build(sentences, order), _reference_kneser_ney(sentences, order)
    words = sorted(w for w in model.ids if w != START)
    histories = [(), (START,), ("the",), ("sat", "on"), (START, "cat"), ("mat", "mat"), ("it", "was")]
    for history in histories:
        history = history[len(history) - (order - 1):] if order > 1 else ()
        for word in words:
            served = model.word_log_prob([model.ids[w] for w in history], model.ids[word])
            assert served == pytest.approx(math.log(reference(history, word)), abs=1e-5), (history, word)


@pytest.mark.parametrize("history", [["<s>"], ["<s>", "the"], ["dog", "sat"], ["was", "was"], ["mat"]])
def test_every_context_is_a_distribution_over_the_words(history):
    model = build(_sentences(), 3)
    ids = [model.ids[w] for w in history]
    total = sum(math.exp(model.word_log_prob(ids, i)) for w, i in model.ids.items() if w != START)
    # The uniform share of START (never predicted) is the only mass missing.
    assert total == pytest.approx(1.0, abs=1e-3)
    assert total < 1.0


def test_unknown_words_are_counted_and_their_context_backs_off_past_them():
    model = build(_sentences(), 3)
    log_prob, unknown = model.sentence_log_prob("the zebra sat".split())
    assert unknown == 1
    ids = model.ids
    expected = (model.word_log_prob([ids[START]], ids["the"]) + model.unknown_log_prob
                + model.word_log_prob([0], ids["sat"])  # after the unknown word: "sat" alone
                + model.word_log_prob([0, ids["sat"]], ids[END]))
    assert log_prob == pytest.approx(expected, abs=1e-6)
    assert model.word_log_prob([0], ids["sat"]) == pytest.approx(model.word_log_prob([], ids["sat"]))
    assert model.unknown_log_prob < min(model.log_probs[0][1:])  # below every word it has seen


def test_a_saved_model_reads_back_the_same(tmp_path):
    model = build(_sentences(), 3)
    model.save(tmp_path / "words.npz")
    loaded = WordLanguageModel.load(tmp_path / "words.npz")
    assert loaded.ids == model.ids and loaded.order == 3
    for sentence in _sentences(20, seed=1):
        assert loaded.sentence_log_prob(sentence.split())[0] == pytest.approx(
            model.sentence_log_prob(sentence.split())[0], rel=2e-3)  # float16 tables


def test_a_file_that_is_not_a_word_lm_is_refused_naming_it(tmp_path):
    bad = tmp_path / "words.npz"
    np.savez(bad, format=np.array("something-else"))
    with pytest.raises(ValueError, match="words.npz.*not a readable word language model"):
        WordLanguageModel.load(bad)
    with pytest.raises(ValueError, match="missing.npz"):
        WordLanguageModel.load(tmp_path / "missing.npz")


def test_perplexity_is_lower_on_the_text_the_model_was_built_from():
    model = build(_sentences(), 3)
    assert perplexity(model, _sentences(50))["perplexity"] < perplexity(model, _sentences(50, seed=7))["perplexity"]
    assert perplexity(model, ["zebra zebra"])["unknown_share"] == pytest.approx(2 / 3, abs=1e-4)


def _candidate(text: str, score: float, tokens: int, finish=FinishReason.EOS) -> ScoredSequence:
    return ScoredSequence(text, [Token(c, 0, 0.0) for c in text[:tokens]], score, finish)


def test_the_rescorer_adds_the_weighted_lm_score_the_word_bonus_and_the_unknown_penalty():
    model = build(_sentences(), 3)
    rescorer = WordRescorer(model, weight=0.4, word_bonus=0.5, unknown_penalty=2.0)
    candidate = _candidate("the cat zebra", -0.5, 13)
    log_prob, unknown = model.sentence_log_prob(["the", "cat", "zebra"])
    assert summed_log_prob(candidate) == pytest.approx(-0.5 * 14)  # its EOS counted in the mean
    assert summed_log_prob(_candidate("the", -0.5, 3, FinishReason.LENGTH)) == pytest.approx(-1.5)
    assert rescorer.score(candidate) == pytest.approx(-7.0 + 0.4 * log_prob + 0.5 * 3 - 2.0 * unknown)


def _speech_manifest() -> dict:
    path = REPOSITORY / "speech-en" / "12" / "manifest.json"
    if not path.is_file():
        pytest.skip("no bundled speech model")
    return json.loads(path.read_text())


def test_the_manifest_names_the_word_lm_and_its_weights():
    manifest = _speech_manifest()
    manifest["word_language_model"] = {"file": "words.npz", "weight": 0.3, "word_bonus": 1.0, "unknown_penalty": 2}
    spec = parse_manifest(manifest, "manifest.json").word_language_model
    assert (spec.file, spec.weight, spec.word_bonus, spec.unknown_penalty) == ("words.npz", 0.3, 1.0, 2.0)


@pytest.mark.parametrize("fields, message", [
    ({"file": "words.npz", "weight": -1}, "word_language_model.weight.*>= 0"),
    ({"file": "words.npz", "weight": 11}, r"word_language_model.weight.*\[0, 10\]"),
    ({"file": "words.npz", "word_bonus": -0.5}, "word_language_model.word_bonus"),
    ({"weight": 0.3}, "word_language_model.file"),
])
def test_word_lm_fields_a_server_cannot_use_are_refused_naming_the_field(fields, message):
    manifest = _speech_manifest()
    manifest["word_language_model"] = fields
    with pytest.raises(ValueError, match=message):
        parse_manifest(manifest, "manifest.json")


def test_a_word_lm_for_a_model_that_reads_text_is_refused():
    manifests = sorted((REPOSITORY / "translate-zh-en").glob("*/manifest.json"))
    if not manifests:
        pytest.skip("no bundled translation model")
    manifest = json.loads(manifests[-1].read_text())
    manifest["word_language_model"] = {"file": "words.npz"}
    with pytest.raises(ValueError, match="word_language_model.*applies to audio input"):
        parse_manifest(manifest, "manifest.json")


def test_a_requests_hotwords_cost_nothing_and_are_not_unknown():
    model = build(_sentences(), 3)
    plain, unknown = model.sentence_log_prob("the zebra sat".split())
    free, free_unknown = model.sentence_log_prob("the zebra sat".split(), free={"zebra"})
    assert (unknown, free_unknown) == (1, 0)
    assert free == pytest.approx(plain - model.unknown_log_prob)
    rescorer = WordRescorer(model, weight=0.5, word_bonus=0.0, unknown_penalty=1.0)
    candidate = _candidate("the zebra sat", -0.5, 13)
    assert rescorer.score(candidate, {"zebra"}) - rescorer.score(candidate) == pytest.approx(
        -0.5 * model.unknown_log_prob + 1.0)


def test_the_weight_search_rescores_as_the_server_does_the_recording_first_on_ties():
    from attnserve.export.speech.word_lm_eval import Clip, rescored, without_word_lm

    model = build(_sentences(), 3)
    a, b = _candidate("the cat sat", -1.0, 11), _candidate("the cap sad", -0.9, 11)
    c = _candidate("the cap sat", -0.9, 11)  # as likely as b to the search
    clip = Clip("the cat sat", [[b, a], [c, a]])  # two readings: the recording's, another speed's
    assert without_word_lm([clip]) == ["the cap sad"]  # the best score, the recording's on a tie
    assert rescored([clip], WordRescorer(model, 0.0, 0.0, 0.0)) == ["the cap sad"]
    assert rescored([clip], WordRescorer(model, 2.0, 0.0, 0.0)) == ["the cat sat"]  # the LM knows "cat sat"
    assert rescored([Clip("x", [[], []])], WordRescorer(model, 1.0, 0.0, 0.0)) == [""]  # no reading answered
