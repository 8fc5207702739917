"""The recurrent translator: padding never leaks into the BiLSTM, training == step-by-step decoding,
ONNX == PyTorch (steps and whole greedy decodes), and the server decodes it from its manifest alone:
served == PyTorch, batched == alone, beams batched == alone."""

from __future__ import annotations

import json
import time

import numpy as np
import onnx
import pytest
import torch

from attnserve.export.common.recurrent_layers import reverse_within_length
from attnserve.export.translation import bpe, recurrent_export
from attnserve.export.translation.recurrent import RecurrentConfig, RecurrentTranslator
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.registry import load_engine, load_engines
from attnserve.api.generation import AttentionOptions, DecodingOptions, GenerationRequest
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions
from conftest import TINY_RECURRENT_NAME
from fakes import BATCHING_MODES, MIXED_MAX_NEW, MIXED_TEXTS, batching, submit_together

ATOL = 1e-5
WAIT = 60
PIECES = AttentionOptions(enabled=True)

torch.set_num_threads(1)


def padded_source(vocab: int, lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids (B, S) and mask; each row ends with EOS."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), max(lengths)), bpe.PAD_ID)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, : n - 1] = torch.randint(6, vocab, (n - 1,), generator=g)
        ids[row, n - 1] = bpe.EOS_ID
        mask[row, :n] = 1
    return ids, mask


def test_reverse_within_length_reverses_real_steps_only():
    x = torch.arange(12.0).view(2, 6, 1)
    lengths = torch.tensor([6, 3])
    flipped = reverse_within_length(x, lengths)
    assert flipped[0, :, 0].tolist() == [5, 4, 3, 2, 1, 0]
    assert flipped[1, :, 0].tolist() == [8, 7, 6, 9, 10, 11]
    assert torch.equal(reverse_within_length(flipped, lengths), x)


def test_encoding_a_padded_batch_equals_encoding_each_row_alone(tiny_recurrent_model):
    model = tiny_recurrent_model
    ids, mask = padded_source(model.cfg.vocab_size, [9, 2, 5])
    with torch.no_grad():
        memory, keys, h, c = model.encode(ids, mask)
        for row, n in enumerate([9, 2, 5]):
            alone = model.encode(ids[row : row + 1, :n], mask[row : row + 1, :n])
            torch.testing.assert_close(alone[0][0], memory[row, :n], atol=ATOL, rtol=0)
            torch.testing.assert_close(alone[1][0], keys[row, :n], atol=ATOL, rtol=0)
            torch.testing.assert_close(alone[2][0], h[row], atol=ATOL, rtol=0)
            torch.testing.assert_close(alone[3][0], c[row], atol=ATOL, rtol=0)
    assert torch.all(memory[1, 2:] == 0), "padding positions carry no state"


@pytest.mark.parametrize("attention", ["additive", "multiplicative"])
def test_teacher_forced_pass_equals_step_by_step_decoding(tiny_tokenizer, attention):
    torch.manual_seed(3)
    cfg = RecurrentConfig(vocab_size=tiny_tokenizer.get_vocab_size(), embed_dim=16, encoder_hidden=8,
                          encoder_layers=1, decoder_hidden=12, attention=attention, dropout=0.0)
    model = RecurrentTranslator(cfg).eval()
    ids, mask = padded_source(cfg.vocab_size, [7, 4])
    target, _ = padded_source(cfg.vocab_size, [6, 6], seed=1)
    with torch.no_grad():
        forced = model(ids, mask, target, None)  # (B, T, V)
        memory, keys, h, c = model.encode(ids, mask)
        feed = model.initial_feed(2)
        for t in range(target.shape[1]):
            logits, h, c, feed, weights = model.decode_step(target[:, t], h, c, feed, memory, keys, mask)
            torch.testing.assert_close(logits, forced[:, t], atol=ATOL, rtol=0)
            torch.testing.assert_close(weights.sum(-1), torch.ones(2))
            assert torch.all(weights[1, 4:] == 0), "no attention on padding"


def test_an_unknown_attention_score_is_refused():
    with pytest.raises(ValueError, match="attention must be one of"):
        RecurrentConfig(vocab_size=10, attention="dot-product")


# ---- ONNX ---------------------------------------------------------------------------------------------


def test_parity_report_is_tight_for_batch_one_and_more_and_several_lengths(tiny_recurrent_model, tiny_recurrent_dir):
    from attnserve.export.translation.parity import CASES, max_abs_differences

    assert {b for b, _, _ in CASES} > {1} and len({s for _, s, _ in CASES}) >= 3
    worst = max_abs_differences(tiny_recurrent_model, tiny_recurrent_dir)
    assert set(worst) == set(recurrent_export.ENCODER_OUTPUTS + recurrent_export.DECODER_OUTPUTS)
    assert max(worst.values()) < ATOL, worst


def test_multiplicative_attention_exports_with_parity(tiny_tokenizer, tmp_path):
    from attnserve.export.translation.onnx_export import export_model
    from attnserve.export.translation.parity import max_abs_differences

    torch.manual_seed(5)
    cfg = RecurrentConfig(vocab_size=tiny_tokenizer.get_vocab_size(), embed_dim=16, encoder_hidden=8,
                          decoder_hidden=12, attention="multiplicative", dropout=0.0)
    model = RecurrentTranslator(cfg).eval()
    out = export_model(model, tiny_tokenizer, tmp_path / "m" / "1", "m", 1)
    assert "multiplicative" in json.loads((out / "manifest.json").read_text())["description"]
    assert max(max_abs_differences(model, out).values()) < ATOL


def test_dynamic_axes_stay_symbolic_and_the_manifest_names_every_tensor(tiny_recurrent_dir):
    manifest = json.loads((tiny_recurrent_dir / "manifest.json").read_text())
    encoder = onnx.load(str(tiny_recurrent_dir / "encoder.onnx")).graph
    decoder = onnx.load(str(tiny_recurrent_dir / "decoder.onnx")).graph

    def dims(graph):
        return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
                for v in list(graph.input) + list(graph.output)}

    enc, dec = dims(encoder), dims(decoder)
    assert enc["input_ids"] == ["batch", "source"]
    assert enc["encoder_hidden_states"][:2] == ["batch", "source"]
    assert enc["initial_state.hidden"][0] == "batch"
    assert dec["encoder_hidden_states"][:2] == ["batch", "source"]
    assert dec["past_state.cell"][0] == "batch" and dec["logits"][0] == "batch"
    assert dec["cross_attentions"] == ["batch", 1, 1, "source"]

    fed = {s["to"] for s in manifest["static"]} | {s["input"] for s in manifest["state"]}
    assert fed | set(manifest["decoder"]["inputs"].values()) == set(recurrent_export.DECODER_INPUTS)
    assert {s["output"] for s in manifest["state"]} | {"logits", "cross_attentions"} == set(
        recurrent_export.DECODER_OUTPUTS
    )
    assert {s["update"] for s in manifest["state"]} == {"replace"}
    assert manifest["attention"]["layers"] == 1 and manifest["attention"]["heads"] == 1


def test_decoder_graph_holds_one_copy_of_the_embedding(tiny_recurrent_dir, tiny_recurrent_model):
    cfg = tiny_recurrent_model.cfg
    graph = onnx.load(str(tiny_recurrent_dir / "decoder.onnx")).graph
    tables = [i.name for i in graph.initializer if int(np.prod(i.dims)) == cfg.vocab_size * cfg.embed_dim]
    assert len(tables) == 1, f"embedding-sized initializers: {tables}"


# ---- served through the manifest ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def registry(tiny_recurrent_dir):
    registry = load_engines(tiny_recurrent_dir.parent.parent, RuntimeOptions(), BatchingOptions())
    yield registry
    registry.close()


def request(i: int, beam_size: int = 1) -> GenerationRequest:
    return GenerationRequest(
        TINY_RECURRENT_NAME,
        MIXED_TEXTS[i],
        ["en", "zh-TW"][i % 2],
        DecodingOptions(max_new_tokens=MIXED_MAX_NEW[i], beam_size=beam_size),
        PIECES,
    )


def test_served_greedy_decode_equals_pytorch(registry, tiny_recurrent_model, tiny_tokenizer):
    engine = registry.get(TINY_RECURRENT_NAME)
    lang = bpe.language_token_ids(tiny_tokenizer)
    for i, text in enumerate(MIXED_TEXTS):
        served = engine.generate(request(i), timeout=WAIT)
        ids = tiny_tokenizer.encode(text).ids + [bpe.EOS_ID]
        tokens, attention = tiny_recurrent_model.greedy_decode(
            torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.int64),
            torch.tensor([lang[request(i).target_language]]), bpe.EOS_ID, MIXED_MAX_NEW[i],
        )
        assert [t.id for t in served.tokens] == tokens[0]
        np.testing.assert_allclose(served.attention.weights, attention[0][:, 0, 0].numpy(), atol=ATOL)
        assert served.attention.reduction.startswith("layer 0 of 1")


@pytest.mark.parametrize("mode", BATCHING_MODES)
@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_batch_of_mixed_lengths_equals_each_request_alone(registry, tiny_recurrent_dir, beam_size, mode):
    engine = registry.get(TINY_RECURRENT_NAME)
    n = len(MIXED_TEXTS)
    version = find_models(tiny_recurrent_dir.parent.parent)[TINY_RECURRENT_NAME]
    together = load_engine(version, RuntimeOptions(), batching(mode, n))
    try:
        futures = submit_together(together, [request(i, beam_size) for i in range(n)])
        batched = [f.result(WAIT) for f in futures]
    finally:
        together.close()
    assert {r.timings.batch_size for r in batched} == {n}
    assert len({len(r.tokens) for r in batched}) >= 3, "rows should finish at different steps"
    for i, result in enumerate(batched):
        alone = engine.generate(request(i, beam_size), timeout=WAIT)
        assert [t.id for t in result.tokens] == [t.id for t in alone.tokens]
        np.testing.assert_allclose(result.attention.weights, alone.attention.weights, atol=ATOL)
