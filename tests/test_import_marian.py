"""`attnserve import` of a MarianMT (OPUS-MT) checkpoint: the served model computes what transformers computes.

The checkpoint (tests/tiny_marian.py) has the published opus-mt-zh-en configs with tiny sizes, SentencePiece
models trained here and widened random weights. Decisive comparisons: the graphs' log-probabilities and every
layer's and head's cross-attention == the eager model's; served greedy and beam outputs == `generate`, on a
padded batch and for requests that join a running batch; tokenizer.json == MarianTokenizer on 1,200 lines
each way.
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil

import numpy as np
import pytest

import tiny_marian
from import_parity import graph_differences, tokens_served_without_torch
from attnserve.clients import cli
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.registry import load_engine
from attnserve.api.generation import AttentionOptions, DecodingOptions, GenerationRequest
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

NAME = "opus-tiny"
ATOL = 5e-5
MAX_NEW = 30  # above every tiny output's length: rows end with EOS, where generate and the server agree
TEXTS = tiny_marian.lines(16, seed=7)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.set_num_threads(1)
    return tiny_marian.build(tmp_path_factory.mktemp("marian") / "opus-mt-tiny")


@pytest.fixture(scope="module")
def repo(checkpoint, tmp_path_factory):
    """The checkpoint imported through the command line, with its int8 variant."""
    repository = tmp_path_factory.mktemp("imported")
    status = cli.main(["import", str(checkpoint), "--name", NAME, "--repository", str(repository),
                       "--variant", "int8"])
    assert status == 0
    return repository


@pytest.fixture(scope="module")
def hf(checkpoint):
    return tiny_marian.transformers_model(checkpoint), tiny_marian.transformers_tokenizer(checkpoint)


@pytest.fixture(scope="module")
def engine(repo):
    engine = load_engine(find_models(repo)[NAME], RuntimeOptions(), BatchingOptions())
    yield engine
    engine.close()


def generate(hf, texts, **options):
    model, tok = hf
    batch = tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=MAX_NEW, output_scores=True, return_dict_in_generate=True,
                             **options)
    return batch, out


def tokens_of(row) -> list[int]:
    ids = row[1:].tolist()  # after the decoder start
    assert 0 in ids, "a reference output ran to the length limit"
    return ids[: ids.index(0)]


def agrees(result, row) -> bool:
    """Served tokens == generate's row; at the length limit, where generate forces EOS
    (forced_eos_token_id) and the server stops, up to there."""
    ids = row[1:].tolist()
    end = ids.index(0)
    served = [t.id for t in result.tokens]
    return served == ids[:end] if end < MAX_NEW - 1 else served[:end] == ids[:end]


def request(text, beam=1, **attention) -> GenerationRequest:
    return GenerationRequest(NAME, text, "", DecodingOptions(MAX_NEW, beam),
                             AttentionOptions(True, **attention) if attention else AttentionOptions())


def test_the_widened_random_weights_attend_peakedly(hf):
    batch, out = generate(hf, TEXTS, num_beams=1)
    with torch.no_grad():
        forward = hf[0](**batch, decoder_input_ids=out.sequences, output_attentions=True)
    weights = torch.stack(forward.cross_attentions)  # (L, B, H, T, S)
    real = batch["attention_mask"].sum(1)  # a uniform row would put 1/S on its peak
    assert weights.max(-1).values.mean() > 0.5 > 3 / real.float().mean()


def test_graphs_equal_the_eager_model_at_every_step_layer_and_head(repo, hf):
    """Log-probabilities and (B, L, H, S) cross-attention of a cached ONNX decode == transformers'."""
    batch, out = generate(hf, TEXTS[:6], num_beams=1)
    seqs = out.sequences.numpy()
    with torch.no_grad():
        forward = hf[0](**batch, decoder_input_ids=out.sequences, output_attentions=True)
    want_lp = torch.log_softmax(forward.logits, -1).numpy()  # (B, T, V)
    want_attention = torch.stack(forward.cross_attentions, 1).numpy()  # (B, L, H, T, S)
    worst_lp, worst_attention = graph_differences(repo / NAME / "1", batch["input_ids"].numpy(),
                                                  batch["attention_mask"].numpy(), seqs, want_lp, want_attention)
    print(f"graphs vs eager: max |log-prob diff| {worst_lp:.2e}, max |attention diff| {worst_attention:.2e}")
    assert worst_lp < ATOL and worst_attention < ATOL


def test_served_greedy_equals_generate_on_a_padded_batch(engine, hf):
    batch, out = generate(hf, TEXTS, num_beams=1)
    with torch.no_grad():
        forward = hf[0](**batch, decoder_input_ids=out.sequences, output_attentions=True)
    layer_mean = torch.stack(forward.cross_attentions, 1).mean(2).numpy()  # (B, L, T, S): mean over heads
    futures = [engine.submit(request(t, layer=0)) for t in TEXTS]  # submitted together: one padded batch
    results = [f.result(120) for f in futures]
    assert max(r.timings.batch_size for r in results) > 1
    for i, result in enumerate(results):
        want = tokens_of(out.sequences[i])
        assert [t.id for t in result.tokens] == want
        assert result.text == hf[1].decode(out.sequences[i], skip_special_tokens=True)
        scores = [float(out.scores[j][i, token]) for j, token in enumerate(want)]  # renormalize_logits: log-probs
        np.testing.assert_allclose([t.logprob for t in result.tokens], scores, atol=ATOL)
        n = int(batch["attention_mask"][i].sum())
        np.testing.assert_allclose(result.attention.weights, layer_mean[i, 0, : len(want), :n], atol=ATOL)


def test_served_beam_search_equals_generate(engine, hf):
    _, out = generate(hf, TEXTS, num_beams=4)  # the checkpoint's num_beams, the manifest's default
    results = [f.result(120) for f in [engine.submit(request(t, beam=0)) for t in TEXTS]]
    assert all(agrees(r, row) for r, row in zip(results, out.sequences))
    assert sum(row[1:].tolist().index(0) < MAX_NEW - 1 for row in out.sequences) >= len(TEXTS) // 2  # EOS of their own


def test_requests_joining_a_running_batch_equal_generate(engine, hf):
    from test_continuous_batching import submit_after

    _, out = generate(hf, TEXTS[:5], num_beams=1)
    longest = int(np.argmax([len(tokens_of(row)) for row in out.sequences]))
    late = [i for i in range(5) if i != longest]
    first, others = submit_after(engine, request(TEXTS[longest]), [request(TEXTS[i]) for i in late], tokens=2)
    results = dict(zip(late, [f.result(120) for f in others]))
    results[longest] = first.result(120)
    assert any(results[i].timings.batch_size > 1 for i in late)
    for i, result in results.items():
        assert [t.id for t in result.tokens] == tokens_of(out.sequences[i])


def test_n_best_heads_and_streaming_work_on_the_imported_model(engine, hf):
    _, out = generate(hf, TEXTS[:1], num_beams=4, num_return_sequences=3)
    nbest = engine.generate(GenerationRequest(NAME, TEXTS[0], "", DecodingOptions(MAX_NEW, 4, num_return_sequences=3)))
    assert [[t.id for t in s.tokens] for s in nbest.nbest] == [tokens_of(row) for row in out.sequences]
    # One head of one layer == that head of transformers' attention.
    batch, greedy = generate(hf, TEXTS[:1], num_beams=1)
    with torch.no_grad():
        forward = hf[0](**batch, decoder_input_ids=greedy.sequences, output_attentions=True)
    head = engine.generate(request(TEXTS[0], layer=1, heads=(2,)))
    n = len(head.tokens)
    np.testing.assert_allclose(head.attention.weights, forward.cross_attentions[1][0, 2, :n].numpy(), atol=ATOL)
    streamed = []
    final = engine.submit(request(TEXTS[0]), streamed.append).result(120)
    assert [s.token.id for s in streamed] == [t.id for t in final.tokens]
    assert "".join(s.text for s in streamed) == final.text


def test_tokenizer_json_equals_marian_tokenizer_on_1200_lines_each_way(engine, hf):
    tok = hf[1]
    lines = tiny_marian.lines(1200, seed=11)
    encoded_differ = [x for x in lines if engine.tokenizer.encode(x) != tok(x).input_ids]
    rng = random.Random(3)
    vocab = engine.tokenizer.vocab_size
    sequences = [[rng.randrange(vocab) for _ in range(rng.randint(1, 20))] for _ in range(1200)]
    decoded_differ = [s for s in sequences if engine.tokenizer.decode(s) != tok.decode(s, skip_special_tokens=True)]
    print(f"tokenizer: encode {len(lines) - len(encoded_differ)}/{len(lines)} equal, "
          f"decode {len(sequences) - len(decoded_differ)}/{len(sequences)} equal")
    assert encoded_differ == [] and decoded_differ == []


@pytest.mark.parametrize("variant", ["int8", "fp16"])
def test_lower_precision_variants_serve_and_their_agreement_with_float32_is_reported(repo, engine, variant, tmp_path):
    if variant == "fp16":  # written by the same quantizer the --variant flag runs (the fixture made int8)
        from attnserve.export.common.quantize import quantize_folder

        shutil.copytree(repo / NAME, tmp_path / NAME)
        quantize_folder(tmp_path / NAME / "1", "fp16")
        repo = tmp_path
    other = load_engine(find_models(repo)[NAME], RuntimeOptions(variant=variant), BatchingOptions())
    try:
        assert other.info.variant == variant
        lines = tiny_marian.lines(30, seed=5)
        fp32 = [[t.id for t in engine.generate(request(x)).tokens] for x in lines]
        low = [[t.id for t in other.generate(request(x)).tokens] for x in lines]
    finally:
        other.close()
    same = sum(a == b for a, b in zip(fp32, low))
    print(f"{variant} outputs equal to float32 on {same}/{len(lines)} lines")
    # A broken variant (wrong weights, lost bias) agrees on almost nothing; int8 of random widened weights
    # drifts on some lines (18/30 with 7-bit weights on AVX2), float16 on none.
    assert same >= {"int8": 0.5, "fp16": 0.9}[variant] * len(lines)


def test_separate_vocabularies_and_embeddings_serve_as_generate(tmp_path, capsys):
    checkpoint = tiny_marian.build(tmp_path / "separate", seed=1, separate=True)
    assert cli.main(["import", str(checkpoint), "--name", NAME, "--repository", str(tmp_path / "repo")]) == 0
    engine = load_engine(find_models(tmp_path / "repo")[NAME], RuntimeOptions(), BatchingOptions())
    try:
        hf = tiny_marian.transformers_model(checkpoint), tiny_marian.transformers_tokenizer(checkpoint)
        _, out = generate(hf, TEXTS[:8], num_beams=1)
        results = [f.result(120) for f in [engine.submit(request(t)) for t in TEXTS[:8]]]
        assert [[t.id for t in r.tokens] for r in results] == [tokens_of(row) for row in out.sequences]
        assert [r.text for r in results] == hf[1].batch_decode(out.sequences, skip_special_tokens=True)
        lines = tiny_marian.lines(300, seed=12)
        assert [engine.tokenizer.encode(x) for x in lines] == [hf[1](x).input_ids for x in lines]
    finally:
        engine.close()


def test_a_multilingual_model_reads_the_requested_target_language_token_first(tmp_path):
    codes = ("cmn_Hans", "cmn_Hant")
    checkpoint = tiny_marian.build(tmp_path / "multilingual", seed=2, target_codes=codes)
    assert cli.main(["import", str(checkpoint), "--name", NAME, "--repository", str(tmp_path / "repo"),
                     "--languages", "zho"]) == 0
    engine = load_engine(find_models(tmp_path / "repo")[NAME], RuntimeOptions(), BatchingOptions())
    try:
        assert engine.info.target_languages == list(codes)
        hf = tiny_marian.transformers_model(checkpoint), tiny_marian.transformers_tokenizer(checkpoint)
        for code in codes:  # MarianTokenizer's users write the code into the text
            _, out = generate(hf, [f">>{code}<< {t}" for t in TEXTS[:6]], num_beams=1)
            served = [engine.submit(dataclasses.replace(request(t), target_language=code)) for t in TEXTS[:6]]
            assert all(agrees(f.result(120), row) for f, row in zip(served, out.sequences))
        result = engine.generate(dataclasses.replace(request(TEXTS[0], layer=0), target_language=codes[1]))
        assert [t.id for t in result.source_tokens] == hf[1](f">>{codes[1]}<< {TEXTS[0]}").input_ids
        assert result.source_tokens[0].piece == f">>{codes[1]}<<"
    finally:
        engine.close()


def test_safetensors_and_weights_only_bin_load_the_same_tensors(checkpoint, tmp_path):
    from attnserve.export.importers.checkpoint import Checkpoint

    other = tmp_path / "bin"
    shutil.copytree(checkpoint, other)
    (other / "model.safetensors").unlink()
    state = Checkpoint(checkpoint).state_dict()
    torch.save(state, other / "pytorch_model.bin")
    loaded = Checkpoint(other).state_dict()
    assert all(torch.equal(state[k], loaded[k]) for k in state)
    torch.save({"weights": state["final_logits_bias"], "code": random.Random}, other / "pytorch_model.bin")
    with pytest.raises(ValueError, match="weights_only=True"):
        Checkpoint(other).state_dict()


@pytest.mark.parametrize("breakage, message", [
    (lambda d: _edit(d / "config.json", architectures=["T5ForConditionalGeneration"]),
     "architecture T5ForConditionalGeneration is not supported"),
    (lambda d: _edit(d / "config.json", rope_theta=10000.0), "key 'rope_theta' is not handled"),
    (lambda d: _edit(d / "config.json", normalize_before=True), "normalize_before=True is not supported"),
    (lambda d: _edit(d / "generation_config.json", no_repeat_ngram_size=3), "no_repeat_ngram_size=3"),
    (lambda d: (d / "source.spm").unlink(), "missing file source.spm"),
    (lambda d: (d / "model.safetensors").unlink(), "no weights"),
    (lambda d: _untie_without_lm_head(d), "missing ['lm_head.weight']"),
])
def test_what_the_importer_cannot_map_is_refused_by_name(checkpoint, tmp_path, capsys, breakage, message):
    broken = tmp_path / "broken"
    shutil.copytree(checkpoint, broken)
    breakage(broken)
    status = cli.main(["import", str(broken), "--name", "x", "--repository", str(tmp_path / "repo")])
    assert status == 1 and message in capsys.readouterr().err
    assert not (tmp_path / "repo" / "x" / "1").exists()


def _edit(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_compare_shows_the_imported_model_beside_a_bundled_style_translator(repo, engine, tiny_model_dir,
                                                                            tmp_path, capsys):
    from attnserve.server.edge import app

    both = tmp_path / "models"
    shutil.copytree(repo / NAME, both / NAME)
    shutil.copytree(tiny_model_dir.parent, both / tiny_model_dir.parent.name)
    engines = app.load_engines(app.ServeOptions(models=str(both)))
    try:
        with app.BackgroundServer(engines) as background:
            status = cli.main(["compare", TEXTS[0], "--models", f"{NAME},{tiny_model_dir.parent.name}", "--json",
                               "--address", background.address])
    finally:
        for e in engines.values():
            e.close()
    out = json.loads(capsys.readouterr().out)
    assert status == 0 and out[tiny_model_dir.parent.name]["tokens"]
    served = out[NAME]
    # compare names no search: the manifest default, the checkpoint's 4 beams
    assert [t["id"] for t in served["tokens"]] == [t.id for t in engine.generate(request(TEXTS[0], beam=0)).tokens]
    assert len(served["attention"]["weights"]) == len(served["tokens"])


def test_the_imported_model_serves_without_torch_transformers_or_sentencepiece(repo, engine):
    request_code = f"GenerationRequest({NAME!r}, {TEXTS[0]!r}, '', DecodingOptions({MAX_NEW}, 1))"
    served = tokens_served_without_torch(repo, NAME, request_code)
    assert served == [t.id for t in engine.generate(request(TEXTS[0])).tokens]


def _untie_without_lm_head(folder):
    """An untied output projection whose weights are not in the file: it must not be served at random."""
    from safetensors.torch import load_file, save_file

    _edit(folder / "config.json", tie_word_embeddings=False)
    state = load_file(str(folder / "model.safetensors"))
    del state["lm_head.weight"]
    save_file(state, str(folder / "model.safetensors"))

