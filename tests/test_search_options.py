"""Search options: n-best against a brute-force search, sampling by seed, minimum length, repetition guard,
and how each is validated. The tiny model of conftest.py, some tests with its vocabulary cut to three
tokens (end-of-sequence and two others) through the manifest's suppression list, so every output can be
enumerated."""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil

import numpy as np
import pytest

from attnserve.server.decoding.batch import Batch
from attnserve.server.decoding.decoding import decode, make_strategy
from attnserve.api.generation import DecodingOptions, FinishReason, GenerationRequest, SamplingOptions
from attnserve.server.decoding.log_softmax import log_softmax
from attnserve.server.decoding.output_rules import OutputRules, repeated_ngram_completions
from attnserve.server.engine.registry import load_engine
from attnserve.server.model.repository import find_models
from attnserve.server.decoding.sampling import draw_token
from attnserve.server.decoding.search import BeamSearch, GreedySearch
from conftest import TINY_MODEL_NAME
from fakes import MIXED_TEXTS, WAIT

SMALL = "tiny-three-tokens"
EOS, KEPT = 2, (10, 20)  # the only tokens the cut-down model may emit
TEXT = "Open the File menu"


@pytest.fixture(scope="module")
def engine(tiny_model_repo):
    engine = load_engine(find_models(tiny_model_repo)[TINY_MODEL_NAME])
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def small_engine(tiny_model_dir, tmp_path_factory):
    """The tiny model with every token suppressed but EOS and KEPT."""
    folder = tmp_path_factory.mktemp("small_repo") / SMALL / "1"
    shutil.copytree(tiny_model_dir, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["name"] = SMALL
    vocab = 160
    manifest["special_tokens"]["suppress"] = [i for i in range(vocab) if i not in (EOS, *KEPT)]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    engine = load_engine(find_models(folder.parent.parent)[SMALL])
    assert engine.tokenizer.vocab_size == vocab
    yield engine
    engine.close()


def request(text=TEXT, model=TINY_MODEL_NAME, **decoding) -> GenerationRequest:
    return GenerationRequest(model, text, "en", DecodingOptions(**decoding))


# ---- n-best ------------------------------------------------------------------------------------------


def next_token_logprobs(engine, text: str, max_new: int) -> dict[tuple[int, ...], np.ndarray]:
    """Prefix of KEPT tokens (shorter than max_new) -> (V,) log-probabilities of the next token, each
    from its own uncached run of the decoder."""
    prepared = engine.prepare(request(text, SMALL))
    out = {}
    for n in range(max_new):
        for prefix in itertools.product(KEPT, repeat=n):
            batch = Batch.build(engine.manifest, engine.runtime, engine.preprocessor.collate([prepared.source]))
            for token in (prepared.start_id, *prefix):
                logits = batch.step(np.array([token])).logits
            out[prefix] = log_softmax(logits)[0]
    return out


def brute_force_nbest(lp: dict, max_new: int) -> list[tuple[float, list[int], FinishReason]]:
    """Every output the cut-down model can produce, scored as beam search scores them, best first."""
    scored = []
    for prefix, dist in lp.items():
        total = sum((lp[prefix[:i]][t] for i, t in enumerate(prefix)), start=0.0)
        scored.append(((total + dist[EOS]) / (len(prefix) + 1), list(prefix), FinishReason.EOS))
        if len(prefix) == max_new - 1:
            for t in KEPT:
                scored.append(((total + dist[t]) / max_new, [*prefix, t], FinishReason.LENGTH))
    return sorted(scored, key=lambda s: -s[0])


@pytest.mark.parametrize("text", [TEXT, "知識就是力量。"])
def test_nbest_equals_a_brute_force_search_over_a_tiny_vocabulary(small_engine, text):
    # 3 tokens, 3 steps: 15 possible outputs, fewer live prefixes than 16 beams, so the search is exhaustive.
    lp = next_token_logprobs(small_engine, text, max_new=3)
    expected = brute_force_nbest(lp, max_new=3)
    assert len(expected) == 15
    result = small_engine.generate(request(text, SMALL, max_new_tokens=3, beam_size=16, num_return_sequences=8))
    got = [(s.score, [t.id for t in s.tokens], s.finish_reason) for s in result.nbest]
    assert [g[1:] for g in got] == [e[1:] for e in expected[:8]]
    np.testing.assert_allclose([g[0] for g in got], [e[0] for e in expected[:8]], rtol=1e-5)
    assert [t.id for t in result.tokens] == got[0][1]
    for sequence in result.nbest:  # every token carries its own log-probability
        ids = [t.id for t in sequence.tokens]
        want = [lp[tuple(ids[:i])][t] for i, t in enumerate(ids)]
        np.testing.assert_allclose([t.logprob for t in sequence.tokens], want, rtol=1e-5)


def test_asking_for_more_sequences_than_exist_returns_those_that_exist(small_engine):
    result = small_engine.generate(request(TEXT, SMALL, max_new_tokens=2, beam_size=16, num_return_sequences=16))
    assert len(result.nbest) == 1 + 2 + 4  # EOS at once, after one token, or two tokens cut by the limit
    assert all(np.isfinite(s.score) for s in result.nbest)


def test_nbest_is_sorted_and_starts_with_the_output(engine):
    result = engine.generate(request(max_new_tokens=8, beam_size=4, num_return_sequences=4))
    scores = [s.score for s in result.nbest]
    assert len(scores) == 4 and scores == sorted(scores, reverse=True)
    assert result.nbest[0].text == result.text and result.nbest[0].tokens == result.tokens
    assert len({tuple(t.id for t in s.tokens) for s in result.nbest}) == 4  # four different sequences


def test_one_sequence_lists_no_nbest_and_beam_search_is_unchanged_by_asking(engine):
    plain = engine.generate(request(max_new_tokens=8, beam_size=4))
    listed = engine.generate(request(max_new_tokens=8, beam_size=4, num_return_sequences=3))
    assert plain.nbest == [] and listed.tokens == plain.tokens
def test_beam_search_of_width_one_asked_through_the_engine_is_greedy(engine):
    greedy = engine.generate(request(max_new_tokens=12))
    prepared = [engine.prepare(request(max_new_tokens=12))]
    beam = make_strategy([dataclasses.replace(prepared[0], beam_size=1)], EOS)
    assert isinstance(beam, GreedySearch)
    strategy = BeamSearch(prepared, EOS)
    batch = Batch.build(engine.manifest, engine.runtime, engine.preprocessor.collate([prepared[0].source]))
    (hyp,) = [h for events in decode(batch, strategy) for h in events.finished]
    assert hyp.token_ids.tolist() == [t.id for t in greedy.tokens]
    np.testing.assert_allclose(hyp.logprobs, [t.logprob for t in greedy.tokens], rtol=1e-6)


# ---- sampling ----------------------------------------------------------------------------------------


def sample(seed, temperature=1.5, **options) -> SamplingOptions:
    return SamplingOptions(temperature=temperature, seed=seed, **options)


def decode_together(engine, requests) -> list[list[int]]:
    """Token ids of each request, all decoded in one batch."""
    prepared = [engine.prepare(r) for r in requests]
    batch = Batch.build(engine.manifest, engine.runtime, engine.preprocessor.collate([p.source for p in prepared]))
    found = {}
    for events in decode(batch, make_strategy(prepared, engine.manifest.special_tokens.eos)):
        found.update({h.index: h.token_ids.tolist() for h in events.finished})
    return [found[i] for i in range(len(requests))]


def test_sampling_is_reproducible_by_seed_alone_and_batched(engine):
    requests = [
        request(MIXED_TEXTS[0], max_new_tokens=20, sampling=sample(7)),
        request(MIXED_TEXTS[1], max_new_tokens=12),  # greedy, in the same batch
        request(MIXED_TEXTS[2], max_new_tokens=20, sampling=sample(8, top_k=20, top_p=0.9)),
        request(MIXED_TEXTS[0], max_new_tokens=20, sampling=sample(8)),
    ]
    alone = [decode_together(engine, [r])[0] for r in requests]
    assert decode_together(engine, requests) == alone
    assert decode_together(engine, requests[::-1]) == alone[::-1]
    assert engine.generate(requests[0]).tokens == engine.generate(requests[0]).tokens
    assert alone[0] != alone[3]  # another seed, another output (same text and options)
    greedy = engine.generate(request(MIXED_TEXTS[0], max_new_tokens=20))
    assert alone[0] != [t.id for t in greedy.tokens]  # it did sample


def test_top_k_one_and_a_tiny_top_p_are_greedy(engine):
    greedy = [t.id for t in engine.generate(request(max_new_tokens=15)).tokens]
    for options in (sample(3, top_k=1), sample(3, top_p=1e-6), sample(3, temperature=1e-3)):
        assert [t.id for t in engine.generate(request(max_new_tokens=15, sampling=options)).tokens] == greedy


def test_draw_token_inverts_the_cumulative_distribution_of_the_kept_tokens():
    logits = np.append(np.log([0.2, 0.5, 0.3]), -np.inf)  # token 3 can never be drawn
    plain = SamplingOptions()
    # Most likely first: token 1 (0.5), token 2 (0.3), token 0 (0.2).
    assert [draw_token(logits, plain, u) for u in (0.0, 0.49, 0.51, 0.79, 0.81, 0.999)] == [1, 1, 2, 2, 0, 0]
    # top_p 0.7 keeps tokens 1 and 2 (0.5 + 0.3 >= 0.7), renormalised to 0.625 / 0.375.
    nucleus = SamplingOptions(top_p=0.7)
    assert [draw_token(logits, nucleus, u) for u in (0.6, 0.63, 0.99)] == [1, 2, 2]
    assert {draw_token(logits, SamplingOptions(top_k=2), u) for u in np.linspace(0, 0.999, 50)} == {1, 2}
    # Temperature 0.5 squares the probabilities: 0.25, 0.09, 0.04 over 0.38.
    sharp = SamplingOptions(temperature=0.5)
    assert [draw_token(logits, sharp, u) for u in (0.65, 0.67, 0.90)] == [1, 2, 0]


# ---- output rules ------------------------------------------------------------------------------------


def test_min_new_tokens_holds_back_eos(small_engine):
    seeds = range(12)
    free = [small_engine.generate(request(max_new_tokens=10, model=SMALL, sampling=sample(s))) for s in seeds]
    assert min(len(r.tokens) for r in free) < 4  # without the rule some samples end early
    for s in seeds:
        held = small_engine.generate(request(max_new_tokens=10, model=SMALL, min_new_tokens=4, sampling=sample(s)))
        assert len(held.tokens) >= 4
    beams = small_engine.generate(request(max_new_tokens=6, model=SMALL, beam_size=4, min_new_tokens=5))
    assert len(beams.tokens) >= 5


def test_no_repeat_ngram_size_forbids_repeated_ngrams(engine):
    def ngrams(ids, n):
        return [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]

    free = [t.id for t in engine.generate(request(max_new_tokens=20)).tokens]
    assert len(set(ngrams(free, 2))) < len(ngrams(free, 2))  # the random model repeats itself
    for n, beams in ((1, 1), (2, 1), (3, 1), (2, 3)):
        result = engine.generate(request(max_new_tokens=20, no_repeat_ngram_size=n, beam_size=beams))
        ids = [t.id for t in result.tokens]
        assert len(ids) > n and len(set(ngrams(ids, n))) == len(ngrams(ids, n))


def test_repeated_ngram_completions():
    tokens = np.array([5, 6, 7, 5, 6])
    assert repeated_ngram_completions(tokens, 3).tolist() == [7]  # 5 6 7 would repeat
    assert repeated_ngram_completions(tokens, 2).tolist() == [7]  # 6 7 would repeat
    assert repeated_ngram_completions(np.append(tokens, 5), 2).tolist() == [6, 6]  # 5 6, seen twice
    assert sorted(repeated_ngram_completions(tokens, 1).tolist()) == [5, 5, 6, 6, 7]
    assert repeated_ngram_completions(tokens[:2], 3).tolist() == []


def test_rules_that_would_forbid_every_token_are_lifted_for_that_step():
    class Prepared:  # the fields OutputRules reads
        min_new_tokens, no_repeat_ngram_size, forced_start, hotwords = 3, 1, None, None

    rules = OutputRules([Prepared()], eos=0)
    rules.start(1)
    rules.extend(np.array([0]), np.array([1]))
    logits = np.array([[2.0, 1.0, -np.inf]])  # EOS held back, token 1 used: nothing left
    rules.apply(logits, np.array([0]), step=1)
    assert logits.tolist() == [[2.0, 1.0, -np.inf]]
    logits = np.array([[2.0, 1.0, 0.5]])
    rules.apply(logits, np.array([0]), step=1)
    assert logits.tolist() == [[-np.inf, -np.inf, 0.5]]


# ---- validation --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "decoding, message",
    [
        ({"beam_size": 2, "num_return_sequences": 3}, "num_return_sequences 3 is out of range: use 1..2"),
        ({"num_return_sequences": 0}, "num_return_sequences 0 is out of range"),
        ({"max_new_tokens": 5, "min_new_tokens": 6}, "min_new_tokens 6 is out of range: use 0..5"),
        ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size -1 is out of range"),
        ({"beam_size": 4, "sampling": SamplingOptions()}, "sampling and beam search do not combine: beam_size is 4"),
        ({"sampling": SamplingOptions(temperature=0.0)}, "temperature 0.0 is out of range: use a number > 0"),
        ({"sampling": SamplingOptions(temperature=float("nan"))}, "temperature nan is out of range"),
        ({"sampling": SamplingOptions(top_k=-1)}, "top_k -1 is out of range"),
        ({"sampling": SamplingOptions(top_p=0.0)}, "top_p 0.0 is out of range: use a number in (0, 1]"),
        ({"sampling": SamplingOptions(top_p=1.5)}, "top_p 1.5 is out of range"),
    ],
)
def test_bad_search_options_are_refused_with_a_message_naming_them(engine, decoding, message):
    with pytest.raises(ValueError) as error:
        engine.prepare(request(**decoding))
    assert message in str(error.value)


def test_sampling_without_a_seed_gets_a_fresh_one(engine):
    seeds = {engine.prepare(request(sampling=SamplingOptions())).sampling.seed for _ in range(3)}
    assert len(seeds) == 3 and None not in seeds
    assert engine.prepare(request(sampling=SamplingOptions(seed=5))).sampling.seed == 5


# ---- over gRPC ---------------------------------------------------------------------------------------


def test_search_options_over_grpc_equal_in_process(tiny_server, engine):
    from attnserve.clients.client import Client, errors

    background, _ = tiny_server
    options = [
        DecodingOptions(max_new_tokens=8, beam_size=4, num_return_sequences=3),
        DecodingOptions(max_new_tokens=12, sampling=sample(11, top_p=0.9), no_repeat_ngram_size=2, min_new_tokens=3),
    ]
    with Client(background.address) as client:
        for decoding in options:
            req = GenerationRequest(TINY_MODEL_NAME, TEXT, "en", decoding)
            remote, local = client.generate(req), engine.generate(req)
            assert remote.tokens == local.tokens and remote.text == local.text
            assert [(s.text, s.finish_reason) for s in remote.nbest] == [(s.text, s.finish_reason) for s in local.nbest]
            np.testing.assert_allclose([s.score for s in remote.nbest], [s.score for s in local.nbest], rtol=1e-6)
        with pytest.raises(errors.InvalidArgument, match="top_p 2.0 is out of range"):
            client.generate(request(sampling=SamplingOptions(top_p=2.0)))


def model_with_default_beams(tiny_model_dir, folder, beams):
    """The tiny model, its manifest naming `beams` as the default search."""
    shutil.copytree(tiny_model_dir, folder / TINY_MODEL_NAME / "1")
    path = folder / TINY_MODEL_NAME / "1" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["decoding"] = {"beam_size": beams}
    path.write_text(json.dumps(manifest))
    return find_models(folder)[TINY_MODEL_NAME]


def test_a_request_naming_no_search_gets_the_models_default(tiny_model_dir, tmp_path, engine):
    """A manifest's `decoding.beam_size` is what requests get when they leave beam_size unset (0): the
    same output as asking for those beams; 1 still means greedy, sampling stays one beam, and ModelInfo
    says what the default is."""
    beamy = load_engine(model_with_default_beams(tiny_model_dir, tmp_path, 4))

    def ids(model, text, **decoding):
        return [t.id for t in model.generate(request(text, **decoding), WAIT).tokens]

    try:
        assert beamy.info.default_beam_size == 4 and engine.info.default_beam_size == 1
        for text in MIXED_TEXTS[:4]:
            assert ids(beamy, text) == ids(engine, text, beam_size=4)
            assert ids(beamy, text, beam_size=1) == ids(engine, text)  # the plain model's default is greedy
        assert len(beamy.generate(request(MIXED_TEXTS[0], num_return_sequences=3), WAIT).nbest) == 3
        sampled = SamplingOptions(seed=3)
        assert ids(beamy, MIXED_TEXTS[0], sampling=sampled) == ids(engine, MIXED_TEXTS[0], beam_size=1,
                                                                    sampling=sampled)
    finally:
        beamy.close()


def test_the_default_search_stays_within_the_servers_beam_limit(tiny_model_dir, tmp_path):
    from attnserve.server.engine.batcher import BatchingOptions
    from attnserve.server.model.runtime import RuntimeOptions

    capped = load_engine(model_with_default_beams(tiny_model_dir, tmp_path, 8), RuntimeOptions(),
                         BatchingOptions(max_beam_size=2))
    try:
        assert capped.info.default_beam_size == 2
        assert capped.prepare(request(MIXED_TEXTS[0])).beam_size == 2
    finally:
        capped.close()


def test_a_default_search_of_no_beams_is_refused(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match=r"decoding.beam_size' must be >= 1, got 0"):
        model_with_default_beams(tiny_model_dir, tmp_path, 0)
