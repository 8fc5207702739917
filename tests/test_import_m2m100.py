"""`attnserve import` of an NLLB-200 / M2M100 checkpoint: the served model computes what transformers computes.

The checkpoint (tests/tiny_nllb.py) has the published nllb-200-distilled-600M configs and its 202 language
codes with tiny sizes, a BPE tokenizer trained here and widened random weights. Decisive comparisons: the
graphs' log-probabilities and every layer's and head's cross-attention == the eager model's; served greedy
and beam outputs == `generate(forced_bos_token_id=...)` (the target-language token first), on a padded
batch and for requests that join a running batch; the source-language token comes from the request;
tokenizer.json == NllbTokenizer on 1,200 lines each way. An m2m100_418M-config checkpoint with M2M100's own
tokenizer files (vocab.json + sentencepiece.bpe.model, rebuilt as BPE) serves greedy and beam == generate,
and its tokenizer equals M2M100Tokenizer on 1,200 lines each way.
"""

from __future__ import annotations

import dataclasses
import json
import random

import numpy as np
import pytest

import tiny_marian
import tiny_nllb
from import_parity import assert_import_refused, edit_json, forward_with_attention, graph_differences, imported, serving
from attnserve.clients import cli
from attnserve.api import convert
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.api.generation import AttentionOptions, DecodingOptions, GenerationRequest
from attnserve.server.engine.registry import load_engine
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

NAME = "nllb-tiny"
ATOL = 5e-5
MAX_NEW = 30  # the language token included; NLLB forces no EOS at the limit, so rows there agree too
TEXTS = tiny_marian.lines(16, seed=7)
SOURCE, TARGET = "zho_Hant", "eng_Latn"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.set_num_threads(1)
    return tiny_nllb.build(tmp_path_factory.mktemp("nllb") / "nllb-tiny")


@pytest.fixture(scope="module")
def repo(checkpoint, tmp_path_factory):
    return imported(checkpoint, tmp_path_factory.mktemp("imported"), NAME)


@pytest.fixture(scope="module")
def hf(checkpoint):
    return tiny_nllb.transformers_model(checkpoint), tiny_nllb.transformers_tokenizer(checkpoint, SOURCE)


@pytest.fixture(scope="module")
def engine(repo):
    yield from serving(repo, NAME)


def generate(hf, texts, target=TARGET, **options):
    model, tok = hf
    batch = tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=MAX_NEW, output_scores=True, return_dict_in_generate=True,
                             forced_bos_token_id=tok.convert_tokens_to_ids(target), **options)
    return batch, out


def tokens_of(row) -> list[int]:
    """generate's output after the decoder start, up to EOS or the limit (pads after EOS dropped)."""
    ids = row[1:].tolist()
    return ids[: ids.index(2)] if 2 in ids else ids


def request(text, beam=1, source=SOURCE, target=TARGET, **attention) -> GenerationRequest:
    return GenerationRequest(NAME, text, target, DecodingOptions(MAX_NEW, beam),
                             AttentionOptions(True, **attention) if attention else AttentionOptions(),
                             source_language=source)


def forward_of(hf, batch, sequences):
    return forward_with_attention(hf[0], batch, sequences)


def test_the_widened_random_weights_attend_peakedly_and_outputs_vary(hf):
    batch, out = generate(hf, TEXTS)
    weights = torch.stack(forward_of(hf, batch, out.sequences).cross_attentions)  # (L, B, H, T, S)
    real = batch["attention_mask"].sum(1)
    assert weights.max(-1).values.mean() > 0.5 > 3 / real.float().mean()
    lengths = [len(tokens_of(row)) for row in out.sequences]
    assert min(lengths) < MAX_NEW and len({tuple(tokens_of(r)) for r in out.sequences}) > len(TEXTS) // 2


def test_graphs_equal_the_eager_model_at_every_step_layer_and_head(repo, hf):
    batch, out = generate(hf, TEXTS[:6])
    forward = forward_of(hf, batch, out.sequences)
    worst_lp, worst_attention = graph_differences(
        repo / NAME / "1", batch["input_ids"].numpy(), batch["attention_mask"].numpy(), out.sequences.numpy(),
        torch.log_softmax(forward.logits, -1).numpy(), torch.stack(forward.cross_attentions, 1).numpy())
    print(f"NLLB graphs vs eager: max |log-prob diff| {worst_lp:.2e}, max |attention diff| {worst_attention:.2e}")
    assert worst_lp < ATOL and worst_attention < ATOL


def test_served_greedy_equals_generate_with_the_forced_language_token(engine, hf):
    batch, out = generate(hf, TEXTS)
    forward = forward_of(hf, batch, out.sequences)
    logprobs = torch.log_softmax(forward.logits, -1)
    layer_mean = torch.stack(forward.cross_attentions, 1).mean(2).numpy()  # (B, L, T, S)
    results = [f.result(120) for f in [engine.submit(request(t, layer=1)) for t in TEXTS]]
    assert max(r.timings.batch_size for r in results) > 1
    target_id = hf[1].convert_tokens_to_ids(TARGET)
    for i, result in enumerate(results):
        want = tokens_of(out.sequences[i])
        assert want[0] == target_id and [t.id for t in result.tokens] == want
        assert [t.id for t in result.source_tokens] == batch["input_ids"][i][batch["attention_mask"][i] == 1].tolist()
        assert result.text == hf[1].decode(out.sequences[i], skip_special_tokens=True)
        # The forced token has log-probability 0 (every other token -inf), as generate's scores say.
        expected = [0.0] + [float(logprobs[i, j, token]) for j, token in enumerate(want) if j > 0]
        np.testing.assert_allclose([t.logprob for t in result.tokens], expected, atol=ATOL)
        n = int(batch["attention_mask"][i].sum())
        np.testing.assert_allclose(result.attention.weights, layer_mean[i, 1, : len(want), :n], atol=ATOL)


def test_every_target_language_is_forced_and_the_source_language_read(engine, hf, checkpoint):
    for source, target in (("eng_Latn", "zho_Hant"), ("fra_Latn", "deu_Latn")):
        tok = tiny_nllb.transformers_tokenizer(checkpoint, source)
        _, out = generate((hf[0], tok), TEXTS[:4], target=target)
        results = [f.result(120) for f in [engine.submit(request(t, source=source, target=target)) for t in TEXTS[:4]]]
        assert [[t.id for t in r.tokens] for r in results] == [tokens_of(row) for row in out.sequences]
        assert [[t.id for t in r.source_tokens] for r in results] == [tok(t).input_ids for t in TEXTS[:4]]
        assert results[0].source_tokens[0].piece == source


def test_served_beam_search_and_n_best_equal_generate(engine, hf):
    _, out = generate(hf, TEXTS, num_beams=4)
    results = [f.result(120) for f in [engine.submit(request(t, beam=4)) for t in TEXTS]]
    assert [[t.id for t in r.tokens] for r in results] == [tokens_of(row) for row in out.sequences]
    _, nbest_out = generate(hf, TEXTS[:1], num_beams=4, num_return_sequences=3)
    nbest = engine.generate(dataclasses.replace(request(TEXTS[0]), decoding=DecodingOptions(MAX_NEW, 4, num_return_sequences=3)))
    assert [[t.id for t in s.tokens] for s in nbest.nbest] == [tokens_of(row) for row in nbest_out.sequences]


def test_requests_joining_a_running_batch_equal_generate(engine, hf):
    from test_continuous_batching import submit_after

    _, out = generate(hf, TEXTS[:5])
    longest = int(np.argmax([len(tokens_of(row)) for row in out.sequences]))
    late = [i for i in range(5) if i != longest]
    first, others = submit_after(engine, request(TEXTS[longest]), [request(TEXTS[i]) for i in late], tokens=2)
    results = dict(zip(late, [f.result(120) for f in others]))
    results[longest] = first.result(120)
    assert any(results[i].timings.batch_size > 1 for i in late)
    for i, result in results.items():
        assert [t.id for t in result.tokens] == tokens_of(out.sequences[i])


def test_the_languages_are_nllb_codes_and_the_wire_carries_the_source_language(engine, repo, checkpoint, tmp_path):
    codes = json.loads((checkpoint / "tokenizer_config.json").read_text())["additional_special_tokens"]
    assert engine.info.source_languages[0] == "eng_Latn" and sorted(engine.info.target_languages) == sorted(codes)
    assert len(codes) == 202 and {"zho_Hant", "zho_Hans", "eng_Latn"} <= set(engine.info.target_languages)
    wire = convert.request_from_proto(convert.request_to_proto(request(TEXTS[0], source="zho_Hans")))
    assert wire.source_language == "zho_Hans"
    with pytest.raises(ValueError, match="unknown source language 'xx_Yyyy'"):
        engine.generate(request(TEXTS[0], source="xx_Yyyy"))
    # --languages serves a subset, its first the default source and target language.
    assert cli.main(["import", str(checkpoint), "--name", "subset", "--repository", str(tmp_path),
                     "--languages", "zho_Hant", "eng_Latn"]) == 0
    manifest = json.loads((tmp_path / "subset" / "1" / "manifest.json").read_text())
    assert manifest["languages"] == {"source": ["zho_Hant", "eng_Latn"], "target": ["zho_Hant", "eng_Latn"]}


def test_tokenizer_json_equals_nllb_tokenizer_on_1200_lines_each_way(engine, hf, checkpoint):
    lines = tiny_marian.lines(1200, seed=11)
    differ = 0
    for k, source in enumerate(("eng_Latn", "zho_Hant", "zho_Hans")):
        tok = tiny_nllb.transformers_tokenizer(checkpoint, source)
        prefix = engine.manifest.source_language_prefix[source]
        differ += sum([prefix, *engine.tokenizer.encode(x)] != tok(x).input_ids for x in lines[k::3])
    rng = random.Random(3)
    vocab = engine.tokenizer.vocab_size
    sequences = [[rng.randrange(vocab) for _ in range(rng.randint(1, 20))] for _ in range(1200)]
    pairs = [(engine.tokenizer.decode(s), hf[1].decode(s, skip_special_tokens=True)) for s in sequences]
    decoded_differ = sum(ours != theirs for ours, theirs in pairs)
    print(f"NLLB tokenizer: encode {len(lines) - differ}/{len(lines)} equal, "
          f"decode {len(sequences) - decoded_differ}/{len(sequences)} equal")
    # The contract strips spaces at both ends of every decoded text; NllbTokenizer keeps the space of a
    # lone "▁" piece at the end (or a second one at the start). Only those differ, and only by that.
    assert differ == 0 and all(ours == theirs.strip(" ") for ours, theirs in pairs)
    assert decoded_differ == sum(theirs != theirs.strip(" ") for _, theirs in pairs) < len(sequences) // 100
    assert any(s[0] >= vocab - 203 for s in sequences)  # language tokens and <mask> are among the decoded ids


def test_m2m100_418m_config_graphs_equal_the_eager_model(tmp_path):
    """The m2m100_418M config (sizes changed): the same graphs."""
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    from attnserve.export.importers import seq2seq_graphs

    config = json.loads((tiny_marian.FIXTURES / "m2m100_418M" / "config.json").read_text())
    config.update(tiny_nllb.SIZES, vocab_size=120)
    torch.manual_seed(4)
    config = M2M100Config.from_dict(config)
    config._attn_implementation = "eager"
    model = M2M100ForConditionalGeneration(config).eval()
    with torch.no_grad():
        tiny_nllb._widen(model, 2)
    seq2seq_graphs.export(model, seq2seq_graphs.Layout(pre_norm=True, position_offset=2, pad_position=1),
                          model.model.encoder.embed_positions.weights, tmp_path)
    assert not model.training  # export puts it back in eval mode (torch.onnx.export leaves it training)
    (tmp_path / "manifest.json").write_text(json.dumps(seq2seq_graphs.manifest_graph_fields(model.config)))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 120, (3, 9), generator=g)
    ids[:, -1] = 2
    mask = torch.ones_like(ids)
    ids[1, 6:], mask[1, 6:] = 1, 0  # a padded row
    decoder = torch.cat([torch.full((3, 1), 2), torch.randint(4, 120, (3, 7), generator=g)], 1)
    with torch.no_grad():
        forward = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder, output_attentions=True)
    worst_lp, worst_attention = graph_differences(
        tmp_path, ids.numpy(), mask.numpy(), decoder.numpy(), torch.log_softmax(forward.logits, -1).numpy(),
        torch.stack(forward.cross_attentions, 1).numpy())
    print(f"M2M100 graphs vs eager: max |log-prob diff| {worst_lp:.2e}, max |attention diff| {worst_attention:.2e}")
    assert worst_lp < ATOL and worst_attention < ATOL


@pytest.mark.parametrize("breakage, message", [
    (lambda d: (d / "tokenizer.json").unlink(), "missing file tokenizer.json"),  # and no vocab.json either
    (lambda d: edit_json(d / "generation_config.json", num_beams=4, early_stopping="never"),
     "early_stopping='never' is not supported"),
    (lambda d: edit_json(d / "config.json", layernorm_embedding=True), "key 'layernorm_embedding' is not handled"),
    (lambda d: edit_json(d / "tokenizer_config.json", legacy_behaviour=True), "legacy_behaviour=True is not supported"),
])
def test_what_the_importer_cannot_map_is_refused_by_name(checkpoint, tmp_path, capsys, breakage, message):
    assert_import_refused(checkpoint, tmp_path, capsys, breakage, message)


def test_translate_from_and_to_over_grpc_reach_the_model(repo, engine, capsys):
    from attnserve.server.edge import app

    engines = app.load_engines(app.ServeOptions(models=str(repo)))
    try:
        with app.BackgroundServer(engines) as background:
            status = cli.main(["translate", TEXTS[1], "--model", NAME, "--from", "zho_Hans", "--to", "fra_Latn",
                               "--max-tokens", str(MAX_NEW), "--json", "--address", background.address])
    finally:
        for e in engines.values():
            e.close()
    out = json.loads(capsys.readouterr().out)
    want = engine.generate(request(TEXTS[1], source="zho_Hans", target="fra_Latn"))
    assert status == 0 and [t["id"] for t in out["tokens"]] == [t.id for t in want.tokens]
    assert out["source_tokens"][0]["piece"] == "zho_Hans"


@pytest.fixture(scope="module")
def m2m100(tmp_path_factory):
    """The m2m100_418M configs with M2M100's own tokenizer files (vocab.json + sentencepiece.bpe.model)."""
    checkpoint = tiny_nllb.build(tmp_path_factory.mktemp("m2m100") / "m2m100-tiny", seed=1, m2m100=True)
    repository = tmp_path_factory.mktemp("m2m100-imported")
    assert cli.main(["import", str(checkpoint), "--name", "m2m", "--repository", str(repository)]) == 0
    engine = load_engine(find_models(repository)["m2m"], RuntimeOptions(), BatchingOptions())
    yield engine, (tiny_nllb.transformers_model(checkpoint), tiny_nllb.transformers_tokenizer(checkpoint, "zh"))
    engine.close()


def test_m2m100_served_greedy_and_beam_equal_generate(m2m100):
    """Beams: the published generation_config's num_beams 5 with early_stopping true, the manifest's
    default (requests name no beam_size), == generate with the checkpoint's own generation settings."""
    engine, (model, tok) = m2m100
    assert engine.info.source_languages[0] == "en" and len(engine.info.target_languages) == 100
    assert engine.manifest.decoding.early_stopping and engine.info.default_beam_size == 5
    batch = tok(TEXTS, return_tensors="pt", padding=True)
    late = None
    for beams in (1, 0):  # 0: the manifest's default
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=MAX_NEW, forced_bos_token_id=tok.get_lang_id("fr"),
                                 **({"num_beams": beams} if beams else {}))
            if beams == 0:
                late = model.generate(**batch, max_new_tokens=MAX_NEW, early_stopping=False,
                                      forced_bos_token_id=tok.get_lang_id("fr"))
        wire = [GenerationRequest("m2m", t, "fr", DecodingOptions(MAX_NEW, beams), source_language="zh") for t in TEXTS]
        results = [f.result(120) for f in [engine.submit(r) for r in wire]]
        assert [[t.id for t in r.tokens] for r in results] == [tokens_of(row) for row in out]
        assert [[t.id for t in r.source_tokens] for r in results] == [tok(t).input_ids for t in TEXTS]
    differ = sum(tokens_of(a) != tokens_of(b) for a, b in zip(out, late))
    print(f"M2M100 beam 5: early_stopping true and false differ on {differ}/{len(TEXTS)} sentences")
    assert differ > 0  # so the comparison above tells the two stopping rules apart


def test_m2m100_tokenizer_equals_m2m100_tokenizer_on_1200_lines_each_way(m2m100):
    engine, (_, tok) = m2m100
    lines = tiny_marian.lines(1200, seed=11)
    prefix = engine.manifest.source_language_prefix["zh"]
    encoded_differ = sum([prefix, *engine.tokenizer.encode(x)] != tok(x).input_ids for x in lines)
    # Ids of the vocabulary (language tokens apart: transformers 5's M2M100Tokenizer writes them into the
    # text even with skip_special_tokens, the server drops them as the special tokens they are).
    rng = random.Random(3)
    first_language = min(engine.manifest.source_language_prefix.values())
    sequences = [[rng.randrange(first_language) for _ in range(rng.randint(1, 20))] for _ in range(1200)]
    pairs = [(engine.tokenizer.decode(s), tok.decode(s, skip_special_tokens=True)) for s in sequences]
    decoded_differ = sum(ours != theirs for ours, theirs in pairs)
    print(f"M2M100 tokenizer: encode {len(lines) - encoded_differ}/{len(lines)} equal, "
          f"decode {len(sequences) - decoded_differ}/{len(sequences)} equal")
    assert encoded_differ == 0 and all(ours == theirs.strip(" ") for ours, theirs in pairs)


def test_the_int8_variant_serves_and_its_agreement_with_float32_is_reported(checkpoint, engine, tmp_path):
    assert cli.main(["import", str(checkpoint), "--name", NAME, "--repository", str(tmp_path), "--variant", "int8"]) == 0
    other = load_engine(find_models(tmp_path)[NAME], RuntimeOptions(variant="int8"), BatchingOptions())
    try:
        assert other.info.variant == "int8"
        lines = tiny_marian.lines(20, seed=5)
        fp32 = [[t.id for t in engine.generate(request(x)).tokens] for x in lines]
        low = [[t.id for t in other.generate(request(x)).tokens] for x in lines]
    finally:
        other.close()
    same = sum(a == b for a, b in zip(fp32, low))
    print(f"NLLB int8 outputs equal to float32 on {same}/{len(lines)} lines")
    assert all(row[0] == fp32[0][0] for row in low)  # the forced language token, whatever the precision
    assert same >= len(lines) // 2
