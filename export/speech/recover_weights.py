"""Recovers a speech recognizer's PyTorch weights from its exported ONNX graphs, to train it further.

Training runs live in ~/.cache and go with the machine; a shipped version folder keeps every weight. The
speller's named layers keep their parameter names; the rest are anonymous initializers whose consumer tells
whose they are:
- each listener LSTM direction is one ONNX LSTM node named after its module (`/listener/lower.0/backward_rnn/LSTM`),
  holding W, R and B with the gates in ONNX's order (input, output, forget, cell) where PyTorch keeps
  (input, forget, cell, output), and B = the input bias then the recurrent bias;
- linear layers without a named weight are MatMuls with the matrix transposed: the one producing
  `encoder_keys` is the attention's key projection, the others are named by their output
  (`/location_proj/MatMul_output_0`, `/v/...`, `/ctc_head/...`).
The config comes from the shapes, the feature floor from the encoder's Clip, the CTC head's layer from the
encoder's CTC frame rate; dropout, which the graphs do not hold, is the config's default. `parity` (export/speech/export.py) then checks recovered == served.

    python -m attnserve.export.speech.recover_weights --model-dir models/speech-en/3 --out RUN.pt \
        --step 3816 --epoch 9 --audio-hours 147.9 --train-minutes 183
    python -m attnserve.export.speech.train --corpus data/speech --run NEW_RUN --init-weights RUN.pt ...
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import numpy_helper

from attnserve.export.common.onnx_weights import PREFIX, initializer_values
from attnserve.export.common.training import checkpoint_fields
from attnserve.export.speech import vocabulary
from attnserve.export.speech.export import parity
from attnserve.export.speech.model import ListenAttendSpell, ListenAttendSpellConfig
from attnserve.export.speech.train import fresh_state

# ONNX LSTM gate blocks (i, o, f, c) -> PyTorch's (i, f, g, o).
_TORCH_GATE_ORDER = [0, 2, 3, 1]
# Anonymous MatMul weights, by the module their output names (or the graph output they are).
_MATMUL_OWNERS = {"encoder_keys": "speller.attention.key_proj", "/location_proj/": "speller.location_proj",
                  "/v/": "speller.attention.v", "/ctc_head/": "ctc_head"}


def _torch_gates(onnx_matrix: np.ndarray) -> np.ndarray:
    """(4H, ...) in ONNX's gate order -> PyTorch's."""
    blocks = np.split(onnx_matrix, 4, axis=0)
    return np.concatenate([blocks[i] for i in _TORCH_GATE_ORDER], axis=0)


def graph_weights(graph: onnx.GraphProto) -> tuple[dict[str, np.ndarray], float | None]:
    """Parameter name -> value for every parameter the graph holds, and its feature floor (encoder only)."""
    values = initializer_values(graph)
    found = {name[len(PREFIX):]: value for name, value in values.items() if name.startswith(PREFIX)}
    floor = None
    for node in graph.node:
        if node.op_type == "LSTM":
            module = node.name.strip("/").rsplit("/", 1)[0].replace("/", ".")  # listener.bottom.forward_rnn
            w, r, b = (values[name][0] for name in node.input[1:4])  # one direction each
            hidden = r.shape[1]
            found[f"{module}.weight_ih_l0"] = _torch_gates(w)
            found[f"{module}.weight_hh_l0"] = _torch_gates(r)
            found[f"{module}.bias_ih_l0"] = _torch_gates(b[: 4 * hidden])
            found[f"{module}.bias_hh_l0"] = _torch_gates(b[4 * hidden:])
        elif node.op_type == "MatMul" and node.input[1] in values and not node.input[1].startswith(PREFIX):
            owners = [m for key, m in _MATMUL_OWNERS.items() if key == node.output[0] or node.output[0].startswith(key)]
            if len(owners) != 1:
                raise ValueError(f"cannot tell whose matrix {node.input[1]} is (output {node.output[0]})")
            found[f"{owners[0]}.weight"] = values[node.input[1]].T
        elif node.op_type == "Clip" and node.input[0] == "input_features":
            floor = float(_constant(graph, values, node.input[1]))
    return found, floor


def _constant(graph: onnx.GraphProto, values: dict[str, np.ndarray], name: str) -> np.ndarray:
    if name in values:
        return values[name]
    for node in graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            return numpy_helper.to_array(node.attribute[0].t)
    raise ValueError(f"{name} is neither an initializer nor a Constant")


def _ctc_reduction(encoder_path: pathlib.Path) -> int:
    """Frames per CTC output, measured: the encoder run on silence."""
    session = ort.InferenceSession(str(encoder_path), providers=["CPUExecutionProvider"])
    frames = 1680  # 2**4 * 3 * 5 * 7: a whole number of every time reduction up to 16
    width = next(i.shape[-1] for i in session.get_inputs() if i.name == "input_features")
    feeds = {"input_features": np.zeros((1, frames, width), np.float32),
             "attention_mask": np.ones((1, frames), np.int64)}
    names = [o.name for o in session.get_outputs()]
    log_probs = dict(zip(names, session.run(None, feeds)))["ctc_log_probs"]
    return frames // log_probs.shape[1]


def config_of(weights: dict[str, np.ndarray], floor: float, n_mels: int, ctc_reduction: int) -> ListenAttendSpellConfig:
    layers = lambda group: len({k.split(".")[2] for k in weights if k.startswith(f"listener.{group}.")})  # noqa: E731
    stack_frames = weights["listener.bottom.forward_rnn.weight_ih_l0"].shape[1] // n_mels
    filters, _, kernel = weights["speller.location_conv.weight"].shape
    return ListenAttendSpellConfig(
        vocab_size=weights["speller.out.weight"].shape[0],
        n_mels=n_mels,
        listener_hidden=weights["listener.bottom.forward_rnn.weight_hh_l0"].shape[1],
        stack_frames=stack_frames,
        bottom_layers=1 + layers("lower"),
        pyramid_layers=layers("pyramid"),
        ctc_layer=int(math.log2(ctc_reduction // stack_frames)),
        speller_hidden=weights["speller.cell.weight_hh"].shape[1],
        embed_dim=weights["speller.embed.weight"].shape[1],
        attention_dim=weights["speller.attention.query_proj.weight"].shape[0],
        location_filters=filters,
        location_kernel=kernel,
        feature_floor=floor,
    )


def recover(model_dir: pathlib.Path, state: dict | None = None) -> dict:
    """A weights file (as `speech.train --save-weights` writes, float32) of the version folder's model.

    Args:
        state: the training state to carry on from (step, epoch, audio_seconds, seconds); the learning-rate
            schedule continues from its step.
    """
    manifest = json.loads((model_dir / "manifest.json").read_text())
    encoder_path, decoder_path = model_dir / manifest["encoder"]["file"], model_dir / manifest["decoder"]["file"]
    encoder, floor = graph_weights(onnx.load(str(encoder_path)).graph)
    decoder, _ = graph_weights(onnx.load(str(decoder_path)).graph)
    if floor is None:
        raise ValueError(f"{encoder_path.name}: no Clip on input_features (the feature floor)")
    weights = {**encoder, **decoder}
    cfg = config_of(weights, floor, manifest["input"]["features"]["n_mels"], _ctc_reduction(encoder_path))
    model = ListenAttendSpell(cfg)
    expected = set(model.state_dict())
    if missing := expected - weights.keys():
        raise ValueError(f"not in the graphs: {sorted(missing)}")
    if extra := weights.keys() - expected:
        raise ValueError(f"in the graphs but not in {cfg}: {sorted(extra)}")
    model.load_state_dict({k: torch.from_numpy(np.array(weights[k], dtype=np.float32)) for k in expected})
    return {
        "model": model.state_dict(),
        **checkpoint_fields(model),
        "tokenizer": vocabulary.character_tokenizer().to_str(),
        "state": {**fresh_state(), **(state or {}), "recovered_from": str(model_dir)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=pathlib.Path, required=True, help="an exported speech version folder")
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--step", type=int, default=0, help="the version's training steps (its model card says)")
    parser.add_argument("--epoch", type=int, default=0)
    parser.add_argument("--audio-hours", type=float, default=0.0, help="hours of audio it was trained on")
    parser.add_argument("--train-minutes", type=float, default=0.0, help="its training time")
    args = parser.parse_args()
    torch.set_num_threads(1)
    checkpoint = recover(args.model_dir, {"step": args.step, "epoch": args.epoch,
                                          "audio_seconds": 3600 * args.audio_hours, "seconds": 60 * args.train_minutes})
    model = ListenAttendSpell(ListenAttendSpellConfig(**checkpoint["config"]))
    model.load_state_dict(checkpoint["model"])
    worst = parity(model, args.model_dir)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, args.out)
    print(json.dumps({"out": str(args.out), "config": checkpoint["config"], "max_abs_diff": worst}, indent=2))


if __name__ == "__main__":
    main()
