"""Exports a trained listen-attend-spell checkpoint to the model contract (docs/model-contract.md, the LSTM
speller example): encoder.onnx, decoder.onnx, tokenizer.json (the characters) and manifest.json.

    python -m attnserve.export.speech.export --checkpoint RUN/best.pt --out models/speech-en/1

encoder.onnx runs the Listener on log-mel frames (T a multiple of the time reduction) and computes what is
constant for a clip: the listener states, their attention keys, the reduced mask and the speller's first
h and c. decoder.onnx is one Speller step; its h, c, attention context and attention weights (the next
step's location features; a state along the source axis) are `replace` state, so the
server's one decode loop (batching, beam search, streaming) runs it like any other model. The legacy
TorchScript exporter keeps the LSTMs' time axes dynamic (the dynamo exporter fixes them to the example's).
The exporter ends with a parity check of ONNX Runtime against PyTorch at lengths and batch sizes unlike
the export example's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import nn

from attnserve.export.common.onnx_graphs import trace, write_tokenizer_and_manifest
from attnserve.export.speech import vocabulary
from attnserve.export.speech.feature_cache import FEATURES, manifest_features
from attnserve.export.speech.model import ListenAttendSpell, pad_features

# Decoder state: (past input, present output, init).
STATE = [
    ("past_state.hidden", "present_state.hidden", {"from": "initial_state.hidden"}),
    ("past_state.cell", "present_state.cell", {"from": "initial_state.cell"}),
    ("past_state.context", "present_state.context", "zeros"),
    ("past_state.attention", "present_state.attention", "zeros"),
]
ENCODER_INPUTS = ["input_features", "attention_mask"]
ENCODER_OUTPUTS = ["encoder_hidden_states", "encoder_keys", "encoder_attention_mask",
                   "initial_state.hidden", "initial_state.cell", "ctc_length", "ctc_log_probs", "ctc_lengths"]
# A row stops after ceil(scale x its CTC best-path length) + offset characters. Chosen on the 238 dev clips
# (seen voices) with the 1,926-step model, from scale 1.0-1.5 x offset 0-12: CER 81.1% without the hint,
# 50.9% at (1.0, 3), 52.6% at (1.15, 3); higher scales let more of the speller's loops through.
LENGTH_HINT = {"output": "ctc_length", "scale": 1.0, "offset": 3}
# Joint CTC/attention decoding (server/decoding/ctc_prefix.py): the CTC head's share of every candidate's score.
CTC_WEIGHT = 0.3
# Beams of a request that names no search. Chosen with the CTC weight on version 3's dev clips (beam 4: CTC
# 0.5 -> 0.3, WER 50.8 -> 45.0%; beam 8 gained 1.6 more at half the speed). Its test clips, greedy at 0.5 ->
# 4 beams at 0.3: CER 25.1 -> 20.7%, WER 56.9 -> 43.2% (held-out voices 37.9 -> 34.4%, 75.2 -> 64.8%), at
# about half the speed (36-39 audio seconds per second on one thread).
DEFAULT_BEAM_SIZE = 4


def served_length_limit(ctc_length: int, max_new_tokens: int) -> int:
    """The most characters the server lets a row decode given its CTC best-path length (as the manifest's
    encoder.length_hint says), for offline references of served output."""
    return min(max_new_tokens, math.ceil(LENGTH_HINT["scale"] * ctc_length) + LENGTH_HINT["offset"])
STATIC = ["encoder_attention_mask", "encoder_hidden_states", "encoder_keys"]
DECODER_INPUTS = ["input_ids", *STATIC, *(past for past, _, _ in STATE)]
DECODER_OUTPUTS = ["logits", *(present for _, present, _ in STATE), "cross_attentions"]
# (batch, frames of each row): rows of odd lengths, none a multiple of the reduction, all unlike the example.
PARITY_CASES = [(1, [13]), (1, [333]), (3, [101, 64, 9]), (4, [611, 250, 57, 400])]


class EncoderGraph(nn.Module):
    """input_features, attention_mask -> listener states, keys, reduced mask, the speller's first h and c, the
    CTC best-path length, and the CTC head's log-probabilities with their lengths."""

    def __init__(self, model: ListenAttendSpell):
        super().__init__()
        self.model = model

    def forward(self, input_features, attention_mask):
        return self.model.encode_for_serving(input_features, attention_mask)


class DecoderStepGraph(nn.Module):
    """One speller step for every row; the state outputs replace the state inputs."""

    def __init__(self, model: ListenAttendSpell):
        super().__init__()
        self.model = model

    def forward(self, input_ids, encoder_attention_mask, memory, keys, h, c, context, previous):
        logits, h, c, context, weights = self.model.decode_step(
            input_ids[:, 0], h, c, context, previous, memory, keys, encoder_attention_mask
        )
        return logits, h, c, context, weights, weights[:, None, None, :]  # attention (B, 1 layer, 1 head, S)


def example_inputs(model: ListenAttendSpell) -> tuple[tuple, tuple]:
    """Encoder and decoder example inputs: 2 rows of 48 frames (one with 37 real), S = 48 / reduction."""
    cfg = model.cfg
    features, mask = pad_features([torch.randn(48, cfg.n_mels), torch.randn(37, cfg.n_mels)], cfg.time_reduction)
    with torch.no_grad():
        memory, keys, reduced, h, c = model.encode(features, mask)
    context = torch.randn(2, 2 * cfg.listener_hidden)
    previous = torch.rand(reduced.shape) * reduced
    ids = torch.tensor([[vocabulary.START_ID], [vocabulary.START_ID + 5]])
    return (features, mask), (ids, reduced, memory, keys, h, c, context, previous)


def export_graphs(model: ListenAttendSpell, out_dir: pathlib.Path) -> None:
    """Writes encoder.onnx and decoder.onnx with the batch, frame and source axes left dynamic."""
    model = model.eval()  # the wrappers below are made in eval mode too: the exporter restores their mode after
    encoder_example, decoder_example = example_inputs(model)
    batch, batch_frames, batch_source = {0: "batch"}, {0: "batch", 1: "frames"}, {0: "batch", 1: "source"}
    trace(
        EncoderGraph(model).eval(), encoder_example, str(out_dir / "encoder.onnx"),
        input_names=ENCODER_INPUTS, output_names=ENCODER_OUTPUTS,
        dynamic_axes={**{n: batch_frames for n in ENCODER_INPUTS}, **{n: batch_source for n in ENCODER_OUTPUTS[:3]},
                      **{n: batch for n in ENCODER_OUTPUTS[3:]}, "ctc_log_probs": {0: "batch", 1: "ctc_frames"}},
    )
    # Shape inference loses the widths behind the listener's row-reversing gathers; they are fixed.
    cfg = model.cfg
    _pin_last_dim(out_dir / "encoder.onnx", {"encoder_hidden_states": 2 * cfg.listener_hidden,
                                             "initial_state.hidden": cfg.speller_hidden,
                                             "initial_state.cell": cfg.speller_hidden,
                                             "ctc_log_probs": cfg.vocab_size})
    trace(
        DecoderStepGraph(model).eval(), decoder_example, str(out_dir / "decoder.onnx"),
        input_names=DECODER_INPUTS, output_names=DECODER_OUTPUTS,
        dynamic_axes={**{n: batch_source for n in [*STATIC, *STATE[3][:2]]},
                      **{n: batch for n in ["input_ids", "logits", *(n for s in STATE[:3] for n in s[:2])]},
                      "cross_attentions": {0: "batch", 3: "source"}},
    )


def _pin_last_dim(path: pathlib.Path, widths: dict[str, int]) -> None:
    """Writes the known size of each named output's last axis into the graph's declared output shape."""
    import onnx

    graph_model = onnx.load(str(path))
    for output in graph_model.graph.output:
        if output.name in widths:
            output.type.tensor_type.shape.dim[-1].dim_value = widths[output.name]
    onnx.checker.check_model(graph_model)
    onnx.save(graph_model, str(path))


def build_manifest(model: ListenAttendSpell, name: str, version: int, max_seconds: float = 20.0,
                   max_new_tokens: int = 400, max_bytes: int = 16 * 2**20, description: str | None = None,
                   ctc_weight: float = CTC_WEIGHT, length_hint: bool = True,
                   default_beam_size: int = DEFAULT_BEAM_SIZE) -> dict:
    """The audio manifest: listener states, keys and mask are static; h, c, context and the previous
    attention are replaced state; the CTC head scores candidates beside the speller with `ctc_weight`,
    `length_hint` bounds each transcript by the CTC best path's length (for a speller decoded alone), and
    requests that name no search get `default_beam_size` beams."""
    cfg = model.cfg
    widths = [cfg.speller_hidden, cfg.speller_hidden, 2 * cfg.listener_hidden, "source"]
    state = [
        {"input": past, "output": present, "update": "replace", "batch_axis": 0, "dtype": "float32",
         "shape": ["batch", width], "init": init}
        for (past, present, init), width in zip(STATE, widths)
    ]
    return {
        "format_version": 1,
        "name": name,
        "version": version,
        "task": "speech-recognition",
        "description": description or (
            f"English speech recognizer (characters): pyramid BiLSTM listener ({cfg.time_reduction}x time "
            "reduction) + LSTM speller with location-aware attention (listen, attend and spell)"
        ),
        "languages": {"source": ["en"], "target": ["en"]},
        "tokenizer": {"file": "tokenizer.json", "word_boundary": "metaspace-cjk"},
        "special_tokens": {"pad": vocabulary.PAD_ID, "unk": vocabulary.UNK_ID, "eos": vocabulary.EOS_ID,
                           "suppress": vocabulary.suppressed_ids()},
        "decoder_start": {"en": vocabulary.START_ID},
        "input": {
            "kind": "audio",
            "sample_rate_hz": FEATURES.sample_rate_hz,
            "features": manifest_features(FEATURES),
            "time_reduction": cfg.time_reduction,
            "max_seconds": max_seconds,
            "max_bytes": max_bytes,
            # No corpus clip reads faster than this: a speller caught in a loop stops near the clip's length.
            "max_tokens_per_second": vocabulary.MAX_CHARACTERS_PER_SECOND,
        },
        "limits": {"max_new_tokens": max_new_tokens},
        "decoding": {"beam_size": default_beam_size},
        "attention": {"output": "cross_attentions", "layers": 1, "heads": 1, "default_layer": -1},
        "encoder": {"file": "encoder.onnx", "inputs": {n: n for n in ENCODER_INPUTS},
                    **({"length_hint": LENGTH_HINT} if length_hint else {}),
                    "ctc": {"log_probs": "ctc_log_probs", "lengths": "ctc_lengths", "blank_id": vocabulary.BLANK_ID,
                            "weight": ctc_weight}},
        "decoder": {"file": "decoder.onnx", "inputs": {"input_ids": "input_ids"}, "outputs": {"logits": "logits"}},
        "static": [{"from": n, "to": n, "batch_axis": 0, "source_axis": 1} for n in STATIC],
        "state": state,
        "model_config": dataclasses.asdict(cfg),
    }


def export_model(model: ListenAttendSpell, tokenizer: Tokenizer, out_dir: pathlib.Path, name: str = "speech-en",
                 **manifest_options) -> pathlib.Path:
    """Writes the whole version folder (its name is the version) and returns it."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    export_graphs(model, out_dir)
    write_tokenizer_and_manifest(out_dir, tokenizer, build_manifest(model, name, int(out_dir.name), **manifest_options))
    return out_dir


def parity(model: ListenAttendSpell, model_dir: pathlib.Path, cases=PARITY_CASES, steps: int = 4, seed: int = 0) -> dict:
    """Largest |ONNX Runtime - PyTorch| per output over `cases`, the decoder chained `steps` steps.

    Each case encodes random frames of the given lengths (padded to the reduction), then feeds both graphs
    the same tokens step by step, each side its own state, so differences accumulate as served.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    encoder = ort.InferenceSession(str(model_dir / "encoder.onnx"), options, providers=["CPUExecutionProvider"])
    decoder = ort.InferenceSession(str(model_dir / "decoder.onnx"), options, providers=["CPUExecutionProvider"])
    rng, model, worst = np.random.default_rng(seed), model.eval(), {}

    def record(names, onnx, torch_):
        for n, o, p in zip(names, onnx, torch_):
            worst[n] = max(worst.get(n, 0.0), float(np.abs(o - p.numpy()).max()))

    for batch, lengths in cases:
        clips = [torch.from_numpy(rng.normal(-5, 3, (t, model.cfg.n_mels)).astype(np.float32)) for t in lengths]
        features, mask = pad_features(clips, model.cfg.time_reduction)
        onnx_enc = encoder.run(None, {"input_features": features.numpy(), "attention_mask": mask.numpy()})
        with torch.no_grad():
            torch_enc = model.encode_for_serving(features, mask)  # memory, keys, reduced, h, c, ctc_length, ...
        record(ENCODER_OUTPUTS, onnx_enc, torch_enc)
        memory, keys, reduced, h, c = torch_enc[:5]
        context, previous = model.initial_context(batch), torch.zeros(reduced.shape)
        onnx_state = [onnx_enc[3], onnx_enc[4], context.numpy(), previous.numpy()]
        for _ in range(steps):
            ids = torch.from_numpy(rng.integers(vocabulary.START_ID, model.cfg.vocab_size, (batch,)))
            feeds = [ids[:, None].numpy(), onnx_enc[2], onnx_enc[0], onnx_enc[1], *onnx_state]
            onnx_dec = decoder.run(None, dict(zip(DECODER_INPUTS, feeds)))
            with torch.no_grad():
                logits, h, c, context, previous = model.decode_step(ids, h, c, context, previous, memory, keys, reduced)
            record(DECODER_OUTPUTS, onnx_dec, [logits, h, c, context, previous, previous[:, None, None, :]])
            onnx_state = onnx_dec[1:5]
    return worst


def main() -> None:
    from attnserve.export.speech.train import load_model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=pathlib.Path, required=True)
    parser.add_argument("--out", type=pathlib.Path, required=True, help="version folder, e.g. models/speech-en/1")
    parser.add_argument("--name", default="speech-en")
    parser.add_argument("--max-seconds", type=float, default=20.0, help="longest clip the server accepts")
    parser.add_argument("--max-new-tokens", type=int, default=400, help="longest transcript, in characters")
    parser.add_argument("--ctc-weight", type=float, default=CTC_WEIGHT,
                        help="the CTC head's share of each candidate's score when served (0: attention alone)")
    parser.add_argument("--default-beam-size", type=int, default=DEFAULT_BEAM_SIZE,
                        help="beams of a request that names none (1: greedy)")
    parser.add_argument("--no-length-hint", action="store_true",
                        help="no CTC length bound on transcripts (joint decoding already keeps the speller in check)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    model, tokenizer, _ = load_model(args.checkpoint)
    export_model(model, tokenizer, args.out, args.name, max_seconds=args.max_seconds,
                 max_new_tokens=args.max_new_tokens, ctc_weight=args.ctc_weight, length_hint=not args.no_length_hint,
                 default_beam_size=args.default_beam_size)
    worst = parity(model, args.out)
    print(json.dumps({"exported": str(args.out), "parity_cases": PARITY_CASES, "max_abs_diff": worst}, indent=2))


if __name__ == "__main__":
    main()
