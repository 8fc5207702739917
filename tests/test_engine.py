"""ModelEngine end to end on the tiny model: validation, results, batching, streaming, cancellation,
failure isolation."""

from __future__ import annotations

import dataclasses
import shutil
import threading
from concurrent.futures import CancelledError

import numpy as np
import pytest

from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.registry import load_engine, load_engines, open_model
from attnserve.api.generation import (
    AttentionGranularity,
    AttentionOptions,
    AttentionReduction,
    DecodingOptions,
    FinishReason,
    GenerationRequest,
    UnavailableError,
)
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions
from fakes import BATCHING_MODES, MIXED_MAX_NEW, MIXED_TEXTS, batching, held, recording_engine, submit_together

MODEL = "tiny-translate"
WAIT = 60  # seconds; only a bound against hanging, never asserted on
TEXTS = MIXED_TEXTS
PIECES = AttentionOptions(enabled=True, layer=-1, granularity=AttentionGranularity.PIECES)
WORDS = AttentionOptions(enabled=True, layer=0, granularity=AttentionGranularity.WORDS)
# Two heads of the last layer, their maximum: rows no longer sum to 1.
MAX_OF_TWO = AttentionOptions(enabled=True, layer=-1, heads=(1, -1), reduction=AttentionReduction.MAX)


@pytest.fixture(scope="module")
def registry(tiny_model_repo):
    registry = load_engines(tiny_model_repo, RuntimeOptions(), BatchingOptions())
    yield registry
    registry.close()


@pytest.fixture(scope="module")
def engine(registry):
    return registry.get(MODEL)


@pytest.fixture(params=BATCHING_MODES)
def mode(request) -> str:
    return request.param


@pytest.fixture
def batch_of_8(tiny_model_repo, mode):
    """An engine in each batching mode that starts at most 8 requests together (see fakes.submit_together)."""
    engine = load_engine(find_models(tiny_model_repo)[MODEL], RuntimeOptions(), batching(mode, 8))
    yield engine
    engine.close()


def request(i: int, max_new_tokens: int = 0, attention=PIECES, beam_size: int = 1) -> GenerationRequest:
    return GenerationRequest(
        MODEL,
        TEXTS[i],
        ["en", "zh-TW"][i % 2],
        DecodingOptions(max_new_tokens=max_new_tokens or MIXED_MAX_NEW[i], beam_size=beam_size),
        attention,
        request_id=f"r{i}",
    )


def test_info_and_registry(registry, engine):
    info = engine.info
    assert (info.name, info.version, info.task) == (MODEL, 1, "translation")
    assert info.target_languages == ["en", "zh-TW"] and info.max_new_tokens == 40 and info.max_source_tokens == 48
    assert (info.attention_layers, info.attention_heads) == (2, 4)
    assert registry.names() == [MODEL] and MODEL in registry and registry.get(MODEL).info == info
    with pytest.raises(ValueError, match="unknown model 'nope'; available: tiny-translate"):
        registry.get("nope")


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"text": "   \n"}, "text is empty"),
        ({"text": ""}, "text is empty"),
        ({"target_language": "fr"}, "unknown target language 'fr' for model 'tiny-translate'; supported: en, zh-TW"),
        ({"text": "知" * 48}, r"source is 49 tokens long \(EOS included\); model 'tiny-translate' accepts at most 48"),
        ({"decoding": DecodingOptions(max_new_tokens=41)}, r"max_new_tokens 41 is out of range: use 1..40, or 0"),
        ({"decoding": DecodingOptions(max_new_tokens=-1)}, "max_new_tokens -1 is out of range"),
        ({"decoding": DecodingOptions(beam_size=-1)}, "beam_size -1 is out of range"),
        ({"attention": AttentionOptions(enabled=True, layer=2)}, "attention layer 2 is out of range: .* has 2 decoder"),
        ({"attention": AttentionOptions(enabled=True, layer=-3)}, "attention layer -3 is out of range"),
        ({"attention": AttentionOptions(enabled=True, heads=(0, 4))},
         r"attention heads \[4\] are out of range: .* has 4 heads per layer \(use 0..3, or -4..-1"),
        ({"attention": AttentionOptions(enabled=True, heads=(1, -3))}, r"attention heads \[1, -3\] name a head twice"),
        ({"model": "other"}, "request for model 'other' sent to model 'tiny-translate'"),
    ],
)
def test_bad_requests_raise_before_queueing(engine, changes, message):
    fields = {"model": MODEL, "text": "Save", **changes}
    if fields["text"].startswith("知"):
        assert len(engine.tokenizer.encode(fields["text"])) == 49, "the tokenizer changed; fix the length"
        assert engine.prepare(GenerationRequest(MODEL, "知" * 47)).source.ids[-1] == 2  # 48 tokens: accepted
    with pytest.raises(ValueError, match=message):
        engine.submit(GenerationRequest(**fields))


def test_result_holds_tokens_sources_and_piece_attention(engine):
    result = engine.generate(request(0, max_new_tokens=6), timeout=WAIT)
    source = engine.tokenizer.encode(TEXTS[0])
    assert result.model == MODEL and result.target_language == "en"
    assert [t.id for t in result.source_tokens] == source and result.source_tokens[-1].piece == "</s>"
    assert 1 <= len(result.tokens) <= 6
    assert result.finish_reason is FinishReason.LENGTH or len(result.tokens) < 6
    assert result.text == engine.tokenizer.decode([t.id for t in result.tokens])
    assert all(t.logprob <= 0 for t in result.tokens)
    m = result.attention
    assert m.layer == 1 and m.reduction == "layer 1 of 2, mean over 4 heads, pieces"
    assert m.row_labels == [t.piece for t in result.tokens]
    assert m.col_labels == [t.piece for t in result.source_tokens]
    np.testing.assert_allclose(np.sum(m.weights, axis=1), 1.0, atol=1e-5)


def test_word_attention_keeps_rows_summing_to_one(engine):
    result = engine.generate(request(6, max_new_tokens=8, attention=WORDS), timeout=WAIT)
    m = result.attention
    assert m.col_labels == ["用", "Python", "寫", "程", "式", "很", "有", "趣", "</s>"]
    assert m.layer == 0 and m.reduction.endswith("words")
    assert len(m.row_labels) == len(engine.tokenizer.words([t.id for t in result.tokens]).labels)
    np.testing.assert_allclose(np.sum(m.weights, axis=1), 1.0, atol=1e-5)


def test_defaults_other_language_no_attention(engine):
    # No target language: English text goes into the model's other language (protos/attnserve/api/language_detection.py).
    result = engine.generate(GenerationRequest(MODEL, "Save", decoding=DecodingOptions(max_new_tokens=2)), WAIT)
    assert result.target_language == "zh-TW" and result.attention is None and len(result.tokens) <= 2
    t = result.timings
    assert t.batch_size == 1 and min(t.queue_seconds, t.encode_seconds, t.decode_seconds) >= 0
    assert t.total_seconds >= t.first_token_seconds >= t.queue_seconds and t.total_seconds >= t.decode_seconds


def test_concurrent_requests_share_a_batch_and_match_alone(engine, batch_of_8):
    streams = [[] for _ in TEXTS]
    futures = submit_together(batch_of_8, [request(i) for i in range(len(TEXTS))], [s.append for s in streams])
    batched = [f.result(WAIT) for f in futures]
    assert {r.timings.batch_size for r in batched} == {8}
    for i, result in enumerate(batched):
        alone = engine.generate(request(i), timeout=WAIT)
        assert alone.timings.batch_size == 1
        assert [t.id for t in result.tokens] == [t.id for t in alone.tokens]
        np.testing.assert_allclose(result.attention.weights, alone.attention.weights, atol=1e-5)
        # streamed == unary: the tokens, and each token's row of the piece matrix
        assert [event.token for event in streams[i]] == result.tokens
        np.testing.assert_allclose([event.attention for event in streams[i]], result.attention.weights, atol=1e-6)


def test_a_failing_request_does_not_fail_its_batch(engine, batch_of_8, monkeypatch):
    # One source holds an id the model does not have: the whole batch's encoder call fails, then every
    # request is retried alone and only the bad one fails.
    encode = batch_of_8.tokenizer.encode
    monkeypatch.setattr(batch_of_8.tokenizer, "encode", lambda text: [10**6] if text == "BAD" else encode(text))
    bad = GenerationRequest(MODEL, "BAD", decoding=DecodingOptions(max_new_tokens=3))
    futures = submit_together(batch_of_8, [bad if i == 3 else request(i) for i in range(8)])
    with pytest.raises(Exception, match="Gather"):
        futures[3].result(WAIT)
    for i in (0, 1, 2, 4, 5, 6, 7):
        result = futures[i].result(WAIT)
        assert result.timings.batch_size == 1  # retried alone
        assert [t.id for t in result.tokens] == [t.id for t in engine.generate(request(i), WAIT).tokens]


def test_a_raising_token_callback_fails_only_its_request(engine, batch_of_8):
    class Gone(Exception):
        pass

    def hang_up(token):
        raise Gone("client went away")

    callbacks = [hang_up if i == 2 else None for i in range(8)]
    futures = submit_together(batch_of_8, [request(i) for i in range(8)], callbacks)
    with pytest.raises(Gone):
        futures[2].result(WAIT)
    results = [futures[i].result(WAIT) for i in range(8) if i != 2]
    assert {r.timings.batch_size for r in results} == {8}
    assert [t.id for t in results[0].tokens] == [t.id for t in engine.generate(request(0), WAIT).tokens]


def test_beam_search_requests(engine):
    streamed = []
    beam = engine.submit(request(5, attention=WORDS, beam_size=3), on_token=streamed.append).result(WAIT)
    greedy = engine.generate(request(5, attention=WORDS), WAIT)
    assert [event.token for event in streamed] == beam.tokens  # beams stream all tokens when they finish
    assert [t.id for t in beam.tokens] != [t.id for t in greedy.tokens], "the test needs beams to differ"
    assert len(beam.attention.row_labels) == len(engine.tokenizer.words([t.id for t in beam.tokens]).labels)
    np.testing.assert_allclose(np.sum(beam.attention.weights, axis=1), 1.0, atol=1e-5)


def test_a_request_chooses_heads_and_how_they_are_combined(engine):
    """One head alone, their mean and their max, read off the same decode: the mean of the four one-head
    matrices is the default matrix, and the max of two is at least either of them."""
    def matrix(**options):
        attention = AttentionOptions(enabled=True, layer=-1, **options)
        return engine.generate(request(5, attention=attention), WAIT).attention

    default = matrix()
    single = [np.array(matrix(heads=(h,)).weights) for h in range(4)]
    np.testing.assert_allclose(np.mean(single, axis=0), default.weights, atol=1e-6)
    assert not np.allclose(single[0], single[1]), "the test needs heads that differ"
    most = matrix(heads=(1, 3), reduction=AttentionReduction.MAX)
    np.testing.assert_allclose(most.weights, np.maximum(single[1], single[3]), atol=1e-6)
    assert most.reduction == "layer 1 of 2, max over heads 1, 3, pieces"
    assert matrix(heads=(-1,)).weights == matrix(heads=(3,)).weights


@pytest.mark.parametrize("beam_size", [1, 3])
@pytest.mark.parametrize("attention", [PIECES, WORDS, MAX_OF_TWO])
def test_streamed_tokens_carry_their_row_of_the_piece_matrix(engine, attention, beam_size):
    streamed = []
    result = engine.submit(request(5, attention=attention, beam_size=beam_size), streamed.append).result(WAIT)
    as_pieces = dataclasses.replace(attention, granularity=AttentionGranularity.PIECES)
    pieces = engine.generate(request(5, attention=as_pieces, beam_size=beam_size), WAIT).attention
    assert [event.index for event in streamed] == list(range(len(result.tokens))) and streamed
    assert [event.token for event in streamed] == result.tokens
    np.testing.assert_allclose([event.attention for event in streamed], pieces.weights, atol=1e-6)
    assert all(len(event.attention) == len(pieces.col_labels) for event in streamed)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_streamed_tokens_carry_no_row_without_attention(engine, beam_size):
    streamed = []
    result = engine.submit(request(5, attention=AttentionOptions(), beam_size=beam_size), streamed.append).result(WAIT)
    assert [event.token for event in streamed] == result.tokens and streamed
    assert all(event.attention is None for event in streamed)


def test_a_cancelled_request_leaves_its_batch_and_its_neighbours_go_on(tiny_model_repo, engine, mode):
    recording, runtime = recording_engine(tiny_model_repo, MODEL, batching(mode, 3))
    long, neighbours, gate = request(2, max_new_tokens=40), [request(1), request(7)], request(0)
    lengths = [engine.prepare(r).source.length for r in (long, *neighbours, gate)]
    assert len(set(lengths)) == 4, "the test tells the rows apart by source length"
    futures, streamed = {}, []

    def cancel_after_first(event):
        streamed.append(event)
        recording.cancel(futures["long"])

    try:
        # The three start together once all are in, so the callback always finds the future.
        with held(recording, gate):
            futures["long"] = recording.submit(long, on_token=cancel_after_first)
            pending = [recording.submit(r) for r in neighbours]
        results = [f.result(WAIT) for f in pending]
        with pytest.raises(CancelledError):
            futures["long"].result(WAIT)
    finally:
        recording.close()  # waits for the batch to end: the cancelled future is answered before it does
    assert len(streamed) == 1
    # Cancelled by its first step's callback, it ran that step and the next, in which its row was dropped.
    assert runtime.calls_with(lengths[0]) == 2 and len(runtime.steps) > 2
    for r, result in zip(neighbours, results):
        alone = engine.generate(r, WAIT)
        assert result.timings.batch_size == 3
        assert [t.id for t in result.tokens] == [t.id for t in alone.tokens]
        np.testing.assert_allclose(result.attention.weights, alone.attention.weights, atol=1e-5)


def test_cancelling_a_queued_or_finished_request(engine, batch_of_8):
    with held(batch_of_8, request(3)):  # the worker is busy: the request waits in the queue
        queued = batch_of_8.submit(request(3))
        batch_of_8.cancel(queued)
        assert queued.cancelled()
    done = engine.submit(request(3, max_new_tokens=2))
    result = done.result(WAIT)
    engine.cancel(done)  # a no-op
    assert done.result(WAIT) is result


def test_mixed_beam_sizes_in_one_batch(engine, batch_of_8, mode):
    futures = submit_together(batch_of_8, [request(i, beam_size=1 + i % 2) for i in range(8)])
    results = [f.result(WAIT) for f in futures]
    # Windowed: one group per beam size, one after the other; continuous: both groups share decoder calls.
    assert {r.timings.batch_size for r in results} == {4 if mode == "window" else 8}
    for i in (0, 1):
        alone = engine.generate(request(i, beam_size=1 + i % 2), WAIT)
        assert [t.id for t in results[i].tokens] == [t.id for t in alone.tokens]


def test_closed_engine_refuses_work(tiny_model_repo):
    engine = load_engine(find_models(tiny_model_repo)[MODEL], RuntimeOptions(), BatchingOptions())
    assert engine.generate(request(3, max_new_tokens=1), WAIT).tokens
    closer = threading.Thread(target=engine.close)
    closer.start()
    closer.join(WAIT)
    with pytest.raises(UnavailableError):
        engine.submit(request(3))


def test_a_tokenizer_smaller_than_the_model_is_refused(tmp_path, tiny_model_repo):
    from attnserve.export.translation import bpe

    repo = tmp_path / "repo"
    shutil.copytree(tiny_model_repo, repo)
    bpe.train_tokenizer(["Save the file", "儲存"], vocab_size=20, min_frequency=1).save(
        str(repo / MODEL / "1" / "tokenizer.json")
    )
    with pytest.raises(ValueError, match=r"decoder.onnx: logits have \d+ classes but .*tokenizer.json has only"):
        load_engines(repo)



def test_open_model_opens_one_model_by_name_and_names_the_others_when_it_is_missing(tiny_model_repo, registry):
    engine = open_model(tiny_model_repo, MODEL)
    try:
        assert engine.info == registry.get(MODEL).info
        assert engine.generate(request(0), WAIT).tokens == registry.get(MODEL).generate(request(0), WAIT).tokens
    finally:
        engine.close()
    with pytest.raises(ValueError, match=f"no model 'nope' in the repository; it has {MODEL}"):
        open_model(tiny_model_repo, "nope")

def test_oversized_text_is_refused_without_tokenizing(engine, monkeypatch):
    limit = engine.manifest.limits.max_source_tokens * engine.tokenizer.max_piece_chars
    # Just under the bound the text is tokenized (and then refused by its token count).
    with pytest.raises(ValueError, match="tokens long"):
        engine.prepare(GenerationRequest(MODEL, "a" * limit))
    monkeypatch.setattr(engine.tokenizer, "encode", lambda text: pytest.fail("tokenized an oversized text"))
    with pytest.raises(ValueError, match=f"source is {limit + 1} characters long"):
        engine.prepare(GenerationRequest(MODEL, "a" * (limit + 1)))


@pytest.mark.parametrize("beam_size", [1, 3])
def test_streamed_texts_concatenate_to_the_result_text(engine, beam_size):
    for i in range(4):
        events = []
        result = engine.submit(request(i, beam_size=beam_size), on_token=events.append).result(timeout=WAIT)
        assert "".join(e.text for e in events) == result.text
        # Special tokens add no text; the tiny random model does emit some.
        special = [e for e in events if e.token.piece.startswith("<")]
        assert all(e.text == "" for e in special)


def test_text_delta_handles_word_markers_and_cjk(engine):
    tok = engine.tokenizer
    ids = tok.encode("Open the File menu 開啟")[:-1]  # without EOS
    deltas = [tok.text_delta(ids[:k], ids[k]) for k in range(len(ids))]
    assert "".join(deltas) == tok.decode(ids) == "Open the File menu 開啟"
