"""`attnserve import` of an mBART-50 checkpoint: the served model computes what transformers computes.

The checkpoint (tests/tiny_mbart.py) has the published mbart-large-50-many-to-many-mmt configs (num_beams 5,
early_stopping true, forced_eos_token_id 2) with tiny sizes, a unigram tokenizer trained here and converted by
MBart50Tokenizer, and widened random weights (learned positions and layernorm_embedding not at their
identity). Decisive comparisons: the graphs' log-probabilities and every layer's and head's cross-attention ==
the eager model's; served greedy and the default beam search == `generate` (the target code forced first,
the checkpoint's own generation settings for beams) on a padded batch; the source code comes from the
request; tokenizer == MBart50Tokenizer on 1,200 lines each way.
"""

from __future__ import annotations

import dataclasses
import json
import random

import numpy as np
import pytest

import tiny_marian
import tiny_mbart
from import_parity import assert_import_refused, edit_json, forward_with_attention, graph_differences, imported, serving
from attnserve.api.generation import AttentionOptions, DecodingOptions, GenerationRequest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

NAME = "mbart-tiny"
ATOL = 5e-5
MAX_NEW = 30  # generate forces EOS as its 30th token (forced_eos_token_id); the server stops there instead
EOS = 2
TEXTS = tiny_marian.lines(16, seed=7)
SOURCE, TARGET = "zh_CN", "en_XX"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.set_num_threads(1)
    return tiny_mbart.build(tmp_path_factory.mktemp("mbart") / "mbart-tiny")


@pytest.fixture(scope="module")
def repo(checkpoint, tmp_path_factory):
    return imported(checkpoint, tmp_path_factory.mktemp("imported"), NAME)


@pytest.fixture(scope="module")
def hf(checkpoint):
    return tiny_mbart.transformers_model(checkpoint), tiny_mbart.transformers_tokenizer(checkpoint, SOURCE)


@pytest.fixture(scope="module")
def engine(repo):
    yield from serving(repo, NAME)


def generate(hf, texts, target=TARGET, **options):
    model, tok = hf
    batch = tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=MAX_NEW, forced_bos_token_id=tok.convert_tokens_to_ids(target),
                             **options)
    return batch, out


def agrees(result, row) -> bool:
    """Served tokens == generate's row after the decoder start, up to EOS; a row that runs to the limit,
    where generate forces EOS and the server stops, up to there."""
    ids = row[1:].tolist()
    end = ids.index(EOS)
    served = [t.id for t in result.tokens]
    return served == ids[:end] if end < MAX_NEW - 1 else served[:end] == ids[:end]


def request(text, beam=1, source=SOURCE, target=TARGET, **attention) -> GenerationRequest:
    return GenerationRequest(NAME, text, target, DecodingOptions(MAX_NEW, beam),
                             AttentionOptions(True, **attention) if attention else AttentionOptions(),
                             source_language=source)


def forward_of(hf, batch, sequences):
    return forward_with_attention(hf[0], batch, sequences)


def test_graphs_equal_the_eager_model_at_every_step_layer_and_head(repo, hf):
    batch, out = generate(hf, TEXTS[:6], num_beams=1)
    forward = forward_of(hf, batch, out)
    weights = torch.stack(forward.cross_attentions, 1)  # (B, L, H, T, S)
    assert weights.max(-1).values.mean() > 0.5  # peaked: the comparison below is not of near-uniform rows
    worst_lp, worst_attention = graph_differences(
        repo / NAME / "1", batch["input_ids"].numpy(), batch["attention_mask"].numpy(), out.numpy(),
        torch.log_softmax(forward.logits, -1).numpy(), weights.numpy())
    print(f"mBART graphs vs eager: max |log-prob diff| {worst_lp:.2e}, max |attention diff| {worst_attention:.2e}")
    assert worst_lp < ATOL and worst_attention < ATOL


def test_served_greedy_equals_generate_with_the_forced_language_code(engine, hf):
    batch, out = generate(hf, TEXTS, num_beams=1)
    forward = forward_of(hf, batch, out)
    logprobs = torch.log_softmax(forward.logits, -1)
    layer_mean = torch.stack(forward.cross_attentions, 1).mean(2).numpy()  # (B, L, T, S)
    results = [f.result(120) for f in [engine.submit(request(t, layer=1)) for t in TEXTS]]
    assert max(r.timings.batch_size for r in results) > 1
    target_id = hf[1].convert_tokens_to_ids(TARGET)
    ended = 0
    for i, result in enumerate(results):
        assert agrees(result, out[i]) and result.tokens[0].id == target_id
        assert [t.id for t in result.source_tokens] == batch["input_ids"][i][batch["attention_mask"][i] == 1].tolist()
        assert result.source_tokens[0].piece == SOURCE
        n_out = len(result.tokens)
        ended += result.finish_reason.name == "EOS"
        if result.finish_reason.name == "EOS":
            assert result.text == hf[1].decode(out[i], skip_special_tokens=True)
        expected = [0.0] + [float(logprobs[i, j, t.id]) for j, t in enumerate(result.tokens) if j > 0]
        np.testing.assert_allclose([t.logprob for t in result.tokens], expected, atol=ATOL)
        n = int(batch["attention_mask"][i].sum())
        np.testing.assert_allclose(result.attention.weights, layer_mean[i, 1, :n_out, :n], atol=ATOL)
    print(f"mBART greedy: {len(results)}/{len(results)} == generate, {ended} ended with EOS before the limit")
    assert ended >= len(results) // 4  # not every row at the limit, where only a prefix is compared


def test_served_default_beam_search_equals_generate_with_the_checkpoints_settings(engine, hf):
    """No beam_size in the requests: the manifest's 5 beams with early stopping, as generation_config."""
    assert engine.info.default_beam_size == 5 and engine.manifest.decoding.early_stopping
    _, out = generate(hf, TEXTS)  # the checkpoint's generation_config: num_beams 5, early_stopping true
    results = [f.result(120) for f in [engine.submit(request(t, beam=0)) for t in TEXTS]]
    assert all(agrees(r, row) for r, row in zip(results, out))
    # n-best under early stopping: the first 5 finished sequences, best first, as num_return_sequences.
    _, nbest_out = generate(hf, TEXTS[:2], num_return_sequences=3)
    for k, text in enumerate(TEXTS[:2]):
        asked = dataclasses.replace(request(text), decoding=DecodingOptions(MAX_NEW, 0, num_return_sequences=3))
        nbest = engine.generate(asked).nbest
        assert len(nbest) == 3 and all(agrees(s, row) for s, row in zip(nbest, nbest_out[3 * k : 3 * k + 3]))
    other = [f.result(120) for f in [engine.submit(request(t, beam=1, target="fr_XX")) for t in TEXTS[:4]]]
    _, want = generate(hf, TEXTS[:4], target="fr_XX", num_beams=1)
    assert all(agrees(r, row) for r, row in zip(other, want))


def test_the_languages_are_mbart50_codes_and_each_reads_its_source_code(engine, checkpoint):
    assert engine.info.source_languages[0] == "en_XX" and len(engine.info.target_languages) == 52
    assert {"zh_CN", "en_XX", "fr_XX", "sl_SI"} <= set(engine.info.target_languages)
    for source in ("en_XX", "de_DE"):
        tok = tiny_mbart.transformers_tokenizer(checkpoint, source)
        result = engine.generate(request(TEXTS[2], source=source))
        assert [t.id for t in result.source_tokens] == tok(TEXTS[2]).input_ids


def test_tokenizer_equals_mbart50_tokenizer_on_1200_lines_each_way(engine, hf, checkpoint):
    import sentencepiece

    lines = tiny_marian.lines(1200, seed=11)
    differ = 0
    for k, source in enumerate(("en_XX", "zh_CN", "ja_XX")):
        tok = tiny_mbart.transformers_tokenizer(checkpoint, source)
        prefix = engine.manifest.source_language_prefix[source]
        differ += sum([prefix, *engine.tokenizer.encode(x)] != tok(x).input_ids for x in lines[k::3])
    # Against SentencePiece itself (fairseq ids: its own + 1, its unknown <unk> = 3): a rebuilt segmentation.
    sp = sentencepiece.SentencePieceProcessor(model_file=str(checkpoint.parent / "spm.model"))
    fairseq = [[3 if i == sp.unk_id() else i + 1 for i in sp.encode(x)] for x in lines]
    spm_differ = [x for x, want in zip(lines, fairseq) if engine.tokenizer.encode(x)[:-1] != want]
    rng = random.Random(3)
    vocab = engine.tokenizer.vocab_size
    sequences = [[rng.randrange(vocab) for _ in range(rng.randint(1, 20))] for _ in range(1200)]
    pairs = [(engine.tokenizer.decode(s), hf[1].decode(s, skip_special_tokens=True)) for s in sequences]
    decoded_differ = sum(ours != theirs for ours, theirs in pairs)
    print(f"mBART tokenizer: encode {len(lines) - differ}/{len(lines)} equal to MBart50Tokenizer, "
          f"{len(lines) - len(spm_differ)}/{len(lines)} to SentencePiece; decode {len(sequences) - decoded_differ}/"
          f"{len(sequences)} equal")
    assert differ == 0 and all(ours == theirs.strip(" ") for ours, theirs in pairs)
    assert decoded_differ < len(sequences) // 100
    # MBart50Tokenizer (transformers' conversion) keeps a `▁` for trailing spaces that SentencePiece trims;
    # the server reads as MBart50Tokenizer does. Only such lines differ from SentencePiece.
    assert all(x != x.rstrip() for x in spm_differ) and len(spm_differ) < len(lines) // 10
    assert any(s[0] >= vocab - 53 for s in sequences)  # language codes and <mask> are among the decoded ids


@pytest.mark.parametrize("breakage, message", [
    (lambda d: edit_json(d / "config.json", normalize_before=False), "normalize_before=False is not supported"),
    (lambda d: edit_json(d / "config.json", rope_theta=1e4), "key 'rope_theta' is not handled"),
    (lambda d: edit_json(d / "generation_config.json", early_stopping="never"),
     "early_stopping='never' is not supported"),
    (lambda d: (d / "tokenizer.json").unlink(), "missing file tokenizer.json"),
])
def test_what_the_importer_cannot_map_is_refused_by_name(checkpoint, tmp_path, capsys, breakage, message):
    assert_import_refused(checkpoint, tmp_path, capsys, breakage, message)
    assert json.loads((checkpoint / "config.json").read_text())["normalize_before"] is True
