"""The exported graphs honour docs/model-contract.md and compute what the PyTorch model computes."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from attnserve.export.common.onnx_graphs import graph_names
from attnserve.export.translation import bpe

ATOL = 1e-4


@pytest.fixture(scope="module")
def sessions(tiny_model_dir):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return (
        ort.InferenceSession(str(tiny_model_dir / "encoder.onnx"), opts, providers=["CPUExecutionProvider"]),
        ort.InferenceSession(str(tiny_model_dir / "decoder.onnx"), opts, providers=["CPUExecutionProvider"]),
    )


def random_source(vocab: int, lengths: list[int], seed: int = 0):
    """Right-padded ids (B, S) and mask for rows of the given lengths (last real token is EOS)."""
    rng = np.random.default_rng(seed)
    ids = np.full((len(lengths), max(lengths)), bpe.PAD_ID, dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, : n - 1] = rng.integers(6, vocab, n - 1)
        ids[row, n - 1] = bpe.EOS_ID
        mask[row, :n] = 1
    return ids, mask


@pytest.mark.parametrize("lengths", [[5], [11, 3, 30], [1, 64]])
def test_encoder_matches_pytorch(tiny_torch_model, sessions, lengths):
    ids, mask = random_source(tiny_torch_model.cfg.vocab_size, lengths)
    encoder, _ = sessions
    got = encoder.run(None, {"input_ids": ids, "attention_mask": mask})
    with torch.no_grad():
        states, cross_kv = tiny_torch_model.encode(torch.from_numpy(ids), torch.from_numpy(mask))
    want = [states] + [t for kv in cross_kv for t in kv]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), atol=ATOL)


@pytest.mark.parametrize("batch,past", [(1, 0), (1, 5), (4, 0), (4, 9)])
def test_decoder_step_matches_pytorch(tiny_torch_model, sessions, batch, past):
    model = tiny_torch_model
    cfg = model.cfg
    lengths = [13, 4, 20, 8][:batch]
    src, src_mask = random_source(cfg.vocab_size, lengths, seed=past)
    encoder, decoder = sessions
    enc = dict(zip(graph_names(cfg.decoder_layers)["encoder_outputs"], encoder.run(None, {"input_ids": src, "attention_mask": src_mask})))
    rng = np.random.default_rng(1)
    dh = cfg.d_model // cfg.heads
    cache = [rng.standard_normal((batch, cfg.heads, past, dh)).astype(np.float32) for _ in range(2 * cfg.decoder_layers)]
    # Rows at different positions with holes in their caches: what continuous batching feeds.
    self_mask = np.ones((batch, past + 1), dtype=np.int64)
    if past > 2:
        self_mask[0, :2] = 0
    token = rng.integers(6, cfg.vocab_size, (batch, 1)).astype(np.int64)
    position = (np.arange(batch)[:, None] + past).astype(np.int64)

    feeds = {"input_ids": token, "position_ids": position, "decoder_attention_mask": self_mask, "encoder_attention_mask": src_mask}
    names = graph_names(cfg.decoder_layers)["decoder_inputs"]
    feeds.update(zip(names[4 : 4 + 2 * cfg.decoder_layers], cache))
    for i in range(cfg.decoder_layers):
        feeds[f"past_key_values.{i}.encoder.key"] = enc[f"present.{i}.encoder.key"]
        feeds[f"past_key_values.{i}.encoder.value"] = enc[f"present.{i}.encoder.value"]
    got = decoder.run(None, feeds)

    t = torch.from_numpy
    with torch.no_grad():
        _, cross_kv = model.encode(t(src), t(src_mask))
        past_kv = [(t(cache[2 * i]), t(cache[2 * i + 1])) for i in range(cfg.decoder_layers)]
        logits, new_kv, weights = model.decode(
            t(token), t(position), t(self_mask).bool()[:, None, None, :], past_kv, cross_kv, t(src_mask)
        )
    want = [logits[:, 0]] + [x for kv in new_kv for x in kv] + [weights[:, :, :, 0]]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), atol=ATOL)
    attention = got[-1]  # (B, L, H, S): a distribution over real source tokens only
    np.testing.assert_allclose(attention.sum(-1), 1.0, atol=1e-5)
    for row, n in enumerate(lengths):
        assert np.all(attention[row, :, :, n:] == 0)


def onnx_greedy(sessions, cfg, ids, mask, start, max_new):
    """A minimal cached greedy loop over the graphs (batch-synchronous), for parity with PyTorch."""
    encoder, decoder = sessions
    names = graph_names(cfg.decoder_layers)
    enc = dict(zip(names["encoder_outputs"], encoder.run(None, {"input_ids": ids, "attention_mask": mask})))
    b, dh = ids.shape[0], cfg.d_model // cfg.heads
    cache = {n: np.zeros((b, cfg.heads, 0, dh), np.float32) for n in names["decoder_inputs"] if ".decoder." in n}
    token = np.array(start, dtype=np.int64)[:, None]
    out = [[] for _ in range(b)]
    done = [False] * b
    for step in range(max_new + 1):
        feeds = {"input_ids": token, "position_ids": np.full((b, 1), step, np.int64),
                 "decoder_attention_mask": np.ones((b, step + 1), np.int64), "encoder_attention_mask": mask, **cache}
        feeds.update({n.replace("present", "past_key_values"): v for n, v in enc.items() if ".encoder." in n})
        res = dict(zip(names["decoder_outputs"], decoder.run(None, feeds)))
        for n in cache:
            cache[n] = np.concatenate([cache[n], res[n.replace("past_key_values", "present")]], axis=2)
        token = res["logits"].argmax(-1)[:, None]
        for row in range(b):
            if not done[row]:
                if token[row, 0] == bpe.EOS_ID or step == max_new:
                    done[row] = True
                else:
                    out[row].append(int(token[row, 0]))
        if all(done):
            break
    return out


def test_greedy_decode_onnx_equals_pytorch_and_cached_equals_uncached(tiny_torch_model, tiny_tokenizer, sessions):
    model = tiny_torch_model
    texts = ["知識就是力量。", "Open the File menu, then choose Save.", "這個按鈕"]
    encoded = [tiny_tokenizer.encode(t).ids + [bpe.EOS_ID] for t in texts]
    ids, mask = random_source(model.cfg.vocab_size, [len(e) for e in encoded])
    for row, e in enumerate(encoded):
        ids[row, : len(e)] = e
    lang = bpe.language_token_ids(tiny_tokenizer)
    start = [lang["en"], lang["zh-TW"], lang["en"]]
    args = (torch.from_numpy(ids), torch.from_numpy(mask), torch.tensor(start), bpe.EOS_ID, 25)
    cached, cached_attention = model.greedy_decode(*args, use_cache=True)
    uncached, uncached_attention = model.greedy_decode(*args, use_cache=False)
    assert cached == uncached
    for a, b in zip(cached_attention, uncached_attention):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5)
    assert any(len(row) > 3 for row in cached), "decode too short to compare anything"
    assert onnx_greedy(sessions, model.cfg, ids, mask, start, 25) == cached


def test_dynamic_axes_stay_symbolic(tiny_model_dir):
    layers = json.loads((tiny_model_dir / "manifest.json").read_text())["attention"]["layers"]
    names = graph_names(layers)
    expected = {
        "encoder.onnx": {"input_ids": {0: "batch", 1: "source"}, "present.0.encoder.key": {0: "batch", 2: "source"}},
        "decoder.onnx": {
            "input_ids": {0: "batch"},
            "decoder_attention_mask": {0: "batch", 1: "past_plus_one"},
            "past_key_values.0.decoder.key": {0: "batch", 2: "past"},
            f"past_key_values.{layers - 1}.encoder.value": {0: "batch", 2: "source"},
            "logits": {0: "batch"},
            "cross_attentions": {0: "batch", 3: "source"},
        },
    }
    for file, axes in expected.items():
        graph = onnx.load(str(tiny_model_dir / file)).graph
        values = {v.name: v for v in list(graph.input) + list(graph.output)}
        side = "encoder" if file == "encoder.onnx" else "decoder"
        assert sorted(values) == sorted(names[f"{side}_inputs"] + names[f"{side}_outputs"])
        for name, dims in axes.items():
            shape = values[name].type.tensor_type.shape.dim
            for axis, symbol in dims.items():
                assert shape[axis].dim_param == symbol, f"{file}:{name} axis {axis} is fixed to {shape[axis].dim_value}"


def test_manifest_names_every_graph_tensor(tiny_model_dir):
    manifest = json.loads((tiny_model_dir / "manifest.json").read_text())
    decoder = onnx.load(str(tiny_model_dir / "decoder.onnx")).graph
    encoder = onnx.load(str(tiny_model_dir / "encoder.onnx")).graph
    dec_in = {v.name for v in decoder.input}
    dec_out = {v.name for v in decoder.output}
    enc_names = {v.name for v in encoder.input} | {v.name for v in encoder.output}
    fed = {s["to"] for s in manifest["static"]} | {s["input"] for s in manifest["state"]}
    fed |= set(manifest["decoder"]["inputs"].values())
    assert fed == dec_in
    assert {s["from"] for s in manifest["static"]} <= enc_names
    assert {s["output"] for s in manifest["state"]} | {manifest["attention"]["output"], "logits"} == dec_out
    tokenizer_ids = manifest["decoder_start"]
    assert set(tokenizer_ids) == set(manifest["languages"]["target"])


def test_an_exported_default_search_reaches_the_served_model_info(tiny_torch_model, tiny_tokenizer, tmp_path):
    """`onnx_export --default-beam-size` names the search requests without one get; unset, they get greedy."""
    from attnserve.export.translation.onnx_export import build_manifest
    from attnserve.server.model.manifest import load_manifest

    for beams, expected in ((4, 4), (None, 1)):
        manifest = build_manifest(tiny_torch_model.cfg, tiny_tokenizer, "tiny", 1, default_beam_size=beams)
        path = tmp_path / f"manifest-{beams}.json"
        path.write_text(json.dumps(manifest))
        assert ("decoding" in manifest) == (beams is not None)
        assert load_manifest(path).decoding.beam_size == expected


def test_decoder_graph_holds_one_copy_of_the_embedding(tiny_model_dir, tiny_torch_model):
    """The tied output projection reads the embedding table; a folded transposed copy would double its size."""
    cfg = tiny_torch_model.cfg
    graph = onnx.load(str(tiny_model_dir / "decoder.onnx")).graph
    tables = [i.name for i in graph.initializer if int(np.prod(i.dims)) == cfg.vocab_size * cfg.d_model]
    assert len(tables) == 1, f"embedding-sized initializers: {tables}"


def test_parity_report_covers_every_output_and_is_tight(tiny_torch_model, tiny_model_dir):
    from attnserve.export.translation.parity import max_abs_differences

    worst = max_abs_differences(tiny_torch_model, tiny_model_dir)
    layers = tiny_torch_model.cfg.decoder_layers
    assert set(worst) == set(graph_names(layers)["encoder_outputs"] + graph_names(layers)["decoder_outputs"])
    assert max(worst.values()) < ATOL


def test_cached_attention_equals_attention_over_the_joined_cache():
    from attnserve.export.translation.model import MultiHeadAttention

    torch.manual_seed(0)
    attention = MultiHeadAttention(32, 4, dropout=0.0).eval()
    x = torch.randn(3, 2, 32)
    past_k, past_v, new_k, new_v = (torch.randn(3, 4, t, 8) for t in (5, 5, 2, 2))
    mask = torch.rand(3, 1, 2, 7) > 0.3
    mask[..., -2:] = True  # every query sees the new positions
    want, _ = attention.attend(x, torch.cat([past_k, new_k], 2), torch.cat([past_v, new_v], 2), mask)
    got = attention.attend_cached(x, past_k, past_v, new_k, new_v, mask)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_decoder_step_never_copies_its_cache(tiny_model_dir):
    """No Concat reads a past self-attention key or value: a step's cost stays flat as the cache grows
    (the server writes new slots into preallocated buffers, server/decoding/kv_cache.py)."""
    graph = onnx.load(str(tiny_model_dir / "decoder.onnx")).graph
    cache_inputs = {i.name for i in graph.input if ".decoder." in i.name}
    assert cache_inputs
    readers = [n for n in graph.node if set(n.input) & cache_inputs]
    assert readers and all(n.op_type != "Concat" for n in readers), [n.op_type for n in readers]
