"""Shared checks of imported seq2seq graphs against the eager transformers model (test_import_*.py)."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort


def graph_differences(folder, ids: np.ndarray, mask: np.ndarray, sequences: np.ndarray,
                      want_logprobs: np.ndarray, want_attention: np.ndarray,
                      encoder_feeds: dict | None = None) -> tuple[float, float]:
    """Runs encoder.onnx and a cached decode of decoder.onnx over `sequences` (B, T) (the decoder's inputs,
    start token first) and returns the largest |log-prob| and |cross-attention| differences from the eager
    model's (B, T, V) log-probabilities and (B, L, H, T, S) cross-attention at every step.

    `encoder_feeds`: the encoder's inputs when they are not token ids (Whisper's log-mel frames)."""
    import torch

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    encoder, decoder = (ort.InferenceSession(str(folder / f), opts, providers=["CPUExecutionProvider"])
                        for f in ("encoder.onnx", "decoder.onnx"))
    enc = dict(zip([o.name for o in encoder.get_outputs()], encoder.run(None, encoder_feeds or {"input_ids": ids, "attention_mask": mask})))
    manifest = json.loads((folder / "manifest.json").read_text())
    cache = {s["input"]: np.zeros((len(ids), s["shape"][1], 0, s["shape"][3]), np.float32) for s in manifest["state"]}
    worst_lp = worst_attention = 0.0
    for step in range(sequences.shape[1] - 1):
        feeds = {"input_ids": sequences[:, step : step + 1], "position_ids": np.full((len(ids), 1), step),
                 "decoder_attention_mask": np.ones((len(ids), step + 1), np.int64),
                 "encoder_attention_mask": mask, **cache}
        feeds.update({s["to"]: enc[s["from"]] for s in manifest["static"] if s["from"] in enc})
        res = dict(zip([o.name for o in decoder.get_outputs()], decoder.run(None, feeds)))
        for s in manifest["state"]:
            cache[s["input"]] = np.concatenate([cache[s["input"]], res[s["output"]]], axis=2)
        lp = torch.log_softmax(torch.from_numpy(res["logits"]), -1).numpy()
        worst_lp = max(worst_lp, _largest(lp - want_logprobs[:, step]))
        worst_attention = max(worst_attention, _largest(res["cross_attentions"] - want_attention[:, :, :, step]))
    return worst_lp, worst_attention


def _largest(difference: np.ndarray) -> float:
    """max |difference|, infinite where either side is NaN (a NaN must never compare as equal)."""
    return float(np.nan_to_num(np.abs(difference), nan=np.inf).max())
