"""Recovers a Transformer translator's PyTorch weights from its exported ONNX graphs.

A shipped version folder is the only lasting copy of a model trained on an earlier machine (training runs live
in ~/.cache and go with the machine). Its graphs hold every weight: named initializers keep their parameter
names (`model.encoder_layers.0.self_attn.q_proj.bias`), while the exporter stores each linear layer's matrix transposed
under an anonymous name (`onnx::MatMul_569`) feeding a MatMul whose output meets the layer's named bias in an
Add. So the matrix's name is its bias's name with `.weight`, and its value the transpose.

The recovered checkpoint (weights, config, tokenizer; no optimizer) starts a further training phase with
`attnserve.export.translation.train --init-from`. Check it with `attnserve.export.translation.parity`: recovered == served.

    python -m attnserve.export.translation.recover_weights --model-dir models/translate-zh-en/1 --out runs/v1-recovered.pt
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib

import numpy as np
import onnx
import torch

from attnserve.export.common.onnx_weights import PREFIX, initializer_values
from attnserve.export.translation.model import Transformer, TransformerConfig


def graph_weights(path: pathlib.Path) -> dict[str, np.ndarray]:
    """Parameter name -> value, for every parameter one graph holds."""
    graph = onnx.load(str(path)).graph
    values = initializer_values(graph)
    found = {name[len(PREFIX) :]: value for name, value in values.items() if name.startswith(PREFIX)}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    for node in graph.node:
        if node.op_type != "MatMul" or node.input[1] not in values or node.input[1].startswith(PREFIX):
            continue
        biases = [
            other
            for add in consumers.get(node.output[0], [])
            if add.op_type == "Add"
            for other in add.input
            if other != node.output[0] and other.startswith(PREFIX) and other.endswith(".bias")
        ]
        if len(biases) != 1:
            raise ValueError(f"{path.name}: cannot tell whose matrix {node.input[1]} is (biases: {biases})")
        found[biases[0][len(PREFIX) : -len(".bias")] + ".weight"] = values[node.input[1]].T
    return found


def config_of(weights: dict[str, np.ndarray], manifest: dict) -> TransformerConfig:
    vocab_size, d_model = weights["embed.weight"].shape
    layers = lambda kind: len({k.split(".")[1] for k in weights if k.startswith(f"{kind}_layers.")})  # noqa: E731
    return TransformerConfig(
        vocab_size=vocab_size,
        d_model=d_model,
        heads=manifest["attention"]["heads"],
        d_ff=weights["encoder_layers.0.feed_forward.net.0.weight"].shape[0],
        encoder_layers=layers("encoder"),
        decoder_layers=layers("decoder"),
    )


def recover(model_dir: pathlib.Path) -> dict:
    """A checkpoint (as export/translation/train.py saves one, without optimizer) of the version folder's weights."""
    manifest = json.loads((model_dir / "manifest.json").read_text())
    encoder = graph_weights(model_dir / manifest["encoder"]["file"])
    decoder = graph_weights(model_dir / manifest["decoder"]["file"])
    for name in encoder.keys() & decoder.keys():  # the embedding is in both graphs
        if not np.array_equal(encoder[name], decoder[name]):
            raise ValueError(f"the graphs disagree on {name}")
    weights = {**encoder, **decoder}
    cfg = config_of(weights, manifest)
    model = Transformer(cfg)
    expected = set(model.state_dict())
    if missing := expected - weights.keys():
        raise ValueError(f"not in the graphs: {sorted(missing)}")
    model.load_state_dict({k: torch.from_numpy(np.array(weights[k])) for k in expected})
    tokenizer = (model_dir / manifest["tokenizer"]["file"]).read_text(encoding="utf-8")
    return {
        "model": model.state_dict(),
        "arch": "transformer",
        "config": dataclasses.asdict(cfg),
        "tokenizer": tokenizer,
        "state": {"recovered_from": str(model_dir), "step": 0, "tokens": 0},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=pathlib.Path, required=True, help="an exported version folder")
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args()
    checkpoint = recover(args.model_dir)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, args.out)
    print(f"{args.out}: {checkpoint['config']}")


if __name__ == "__main__":
    main()
