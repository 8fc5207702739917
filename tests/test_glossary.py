"""Glossaries: terms found in the text, refused when they cannot be enforced, and placed in the output by
constrained beam search, on the tiny model through the server; a batch without terms decodes as before."""

from __future__ import annotations

import dataclasses

import pytest

from attnserve.clients import errors
from attnserve.clients.client import translation_request
from attnserve.server.decoding import glossary
from attnserve.api.generation import DecodingOptions, GenerationRequest
from conftest import TINY_MODEL_NAME

TEXT = "知識就是力量。"


class _Tokenizer:
    """Characters as ids (ord), EOS 0; "?" stands for a piece the vocabulary lacks (unk 63)."""

    def encode(self, text):
        return [ord(c) for c in text] + [0]


def constraints(text, requested=(), default=None, beam_size=4, max_new_tokens=40, use_default=True):
    terms = glossary.Glossary(default or {}, _Tokenizer(), unk=ord("?"), text_model=True)
    request = GenerationRequest("m", text=text, decoding=DecodingOptions(glossary=tuple(requested),
                                                                           use_default_glossary=use_default))
    return terms.constraints(request, max_new_tokens, beam_size)


def test_terms_are_found_longest_first_and_request_terms_win():
    found = constraints("深度學習和學習", default={"學習": "study", "深度學習": "deep learning"})
    assert [(c.source, c.target, c.source_start, c.source_end) for c in found] == [
        ("深度學習", "deep learning", 0, 4), ("學習", "study", 5, 7)]
    assert found[0].token_ids == tuple(map(ord, "deep learning"))
    found = constraints("深度學習", [("度學", "X")], default={"深度學習": "deep learning"})
    assert [c.source for c in found] == ["度學"]  # the request's term displaces the default one it overlaps
    assert constraints("深度學習", default={"深度學習": "deep learning"}, use_default=False) == ()
    found = constraints("Deep learning works", [("deep learning", "深度學習")])  # case does not matter
    assert [(c.source, c.source_start, c.source_end) for c in found] == [("Deep learning", 0, 13)]
    # The default glossary is skipped, not refused, under greedy search.
    assert constraints("深度學習", default={"深度學習": "deep learning"}, beam_size=1) == ()


@pytest.mark.parametrize(
    "requested, kwargs, message",
    [
        ([("深度", "a"), ("度學", "b")], {}, "glossary terms '深度' and '度學' overlap"),
        ([("深度", "a?")], {}, "target term 'a?' cannot be written"),
        ([("深度", " ")], {}, "target term is empty"),
        ([("", "a")], {}, "source term is empty"),
        ([("深度", "abc")], {"beam_size": 1}, "term(s) '深度' need beam search"),
        ([("深度", "abcdef")], {"max_new_tokens": 5}, "need 6 tokens ('abcdef'); max_new_tokens is 5"),
        ([(c, "x") for c in "深度學習一二三四五六七八九十甲乙丙"], {}, "at most 16"),
    ],
)
def test_terms_that_cannot_be_enforced_are_refused_by_name(requested, kwargs, message):
    with pytest.raises(ValueError, match=None) as refused:
        constraints("深度學習一二三四五六七八九十甲乙丙", requested, **kwargs)
    assert message in str(refused.value)


def test_placements_find_each_target_once():
    found = constraints("ab ab", [("ab", "xy")])
    ids = [1, *map(ord, "xy"), 2, *map(ord, "xy")]
    assert [(p.output_start, p.output_end) for p in glossary.placements(found, ids)] == [(1, 3), (4, 6)]
    assert [(p.output_start, p.output_end) for p in glossary.placements(found, ids[:3])] == [(1, 3), (-1, -1)]


def request(client, terms=(), beam_size=3, **options):
    base = translation_request(TEXT, "en", True, "pieces", model=TINY_MODEL_NAME)
    return dataclasses.replace(base, decoding=DecodingOptions(beam_size=beam_size, glossary=tuple(terms), **options))


def test_the_output_contains_the_term_where_the_response_says(tiny_server):
    from attnserve.clients.client import Client

    server, engines = tiny_server
    tokenizer = engines[TINY_MODEL_NAME].tokenizer
    with Client(server.address, timeout=60) as client:
        plain = client.generate(request(client))
        target = "power"
        assert target not in plain.text
        result = client.generate(request(client, [("力量", target), ("知識", "knowledge")]))
    ids = [t.id for t in result.tokens]
    for placement, (source, term) in zip(result.glossary, [("知識", "knowledge"), ("力量", target)]):
        assert (placement.source, placement.target) == (source, term)
        assert TEXT[placement.source_start : placement.source_end] == source
        assert ids[placement.output_start : placement.output_end] == tokenizer.encode(term)[:-1]
    assert target in result.text and "knowledge" in result.text
    assert len(result.attention.weights) == len(ids)  # piece rows: the placed tokens' attention is there


def test_without_terms_the_search_is_unchanged(tiny_server):
    """A request whose text holds none of its terms decodes exactly as with no glossary (BeamSearch)."""
    from attnserve.clients.client import Client

    server, _ = tiny_server
    with Client(server.address, timeout=60) as client:
        plain = client.generate(request(client))
        unmatched = client.generate(request(client, [("不在", "absent")]))
    assert unmatched.text == plain.text and unmatched.glossary == []
    assert unmatched.attention.weights == plain.attention.weights


def test_refusals_over_grpc_name_the_term(tiny_server):
    from attnserve.clients.client import Client

    server, _ = tiny_server
    with Client(server.address, timeout=60) as client:
        with pytest.raises(errors.InvalidArgument, match="'力量' need beam search"):
            client.generate(request(client, [("力量", "power")], beam_size=1))
        with pytest.raises(errors.InvalidArgument, match="glossary terms '知識' and '識就' overlap"):
            client.generate(request(client, [("知識", "a"), ("識就", "b")]))


def _decoded(engine, prepared):
    from attnserve.server.decoding.decoding import Batch, decode, make_strategy

    batch = Batch.build(engine.manifest, engine.runtime, engine.preprocessor.collate([p.source for p in prepared]))
    strategy = make_strategy(prepared, engine.manifest.special_tokens.eos)
    finished = {h.index: h for events in decode(batch, strategy) for h in events.finished}
    return type(strategy).__name__, [finished[i].token_ids.tolist() for i in range(len(prepared))]


def test_a_request_without_terms_beside_one_with_them_decodes_as_alone(tiny_server):
    """In one batch, constrained search leaves the unconstrained request's output as BeamSearch gives it."""
    _, engines = tiny_server
    engine = engines[TINY_MODEL_NAME]
    other = "力量就是知識。"
    plain = engine.prepare(GenerationRequest(TINY_MODEL_NAME, text=other, target_language="en",
                                             decoding=DecodingOptions(beam_size=3)))
    constrained = engine.prepare(GenerationRequest(TINY_MODEL_NAME, text=TEXT, target_language="en",
                                                   decoding=DecodingOptions(beam_size=3, glossary=(("力量", "power"),))))
    alone_name, (alone,) = _decoded(engine, [plain])
    mixed_name, (beside, with_terms) = _decoded(engine, [plain, constrained])
    assert (alone_name, mixed_name) == ("BeamSearch", "ConstrainedBeamSearch")
    assert beside == alone
    term = engine.tokenizer.encode("power")[:-1]
    assert any(with_terms[i : i + len(term)] == term for i in range(len(with_terms)))


def test_the_page_gets_the_word_rows_of_each_term():
    pytest.importorskip("aiohttp", reason="the web gateway needs the `web` extra (aiohttp)")
    from attnserve.clients.web import payload
    from attnserve.api.generation import AttentionMatrix, FinishReason, GenerationResult, GlossaryPlacement, Timings, Token

    pieces = ["▁We", "▁att", "ention", "▁mechanism", "▁today", "."]
    labels = ["We", "attention", "mechanism", "today."]
    result = GenerationResult(
        "m", "We attention mechanism today.", "en", [Token(p, i, 0.0) for i, p in enumerate(pieces)], [],
        FinishReason.EOS, AttentionMatrix([[1.0]] * 4, labels, ["x"], 0, ""), Timings(0, 0, 0, 0, 0, 1),
        glossary=[GlossaryPlacement("注意力機制", "attention mechanism", 0, 5, 1, 4),
                  GlossaryPlacement("今天", "today", 5, 7, -1, -1)],
    )
    assert payload.result_json(result)["glossary_rows"] == [[1, 2], []]
    words = dataclasses.replace(result, attention=dataclasses.replace(result.attention, row_labels=["?"] * 4))
    assert payload.result_json(words)["glossary_rows"] == [[], []]  # labels that are not joins of the pieces
