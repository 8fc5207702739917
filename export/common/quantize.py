"""Adds a lower-precision variant to an exported version folder: its encoder and decoder again, smaller.

- `int8`: ONNX Runtime's dynamic quantization stores the weight matrices of MatMul and Gemm nodes as int8
  (per output channel) and quantizes activations on the fly; embedding lookups and norms stay float32 (the
  tied output projection gets its own int8 copy of the embedding table). For CPUs.
- `fp16`: every weight and activation in float16 (ONNX Runtime's converter), the graphs' inputs and outputs
  kept float32, so the server's decode loop and cache are unchanged. For GPUs (half the memory, tensor
  cores); ONNX Runtime's CPU provider runs it too, slower than float32.

The graphs keep their inputs and outputs, so the manifest names them as a variant and `attnserve serve
--variant NAME` runs them (docs/model-contract.md). Score a variant before shipping it: evaluate with
`--served-variant NAME`.

    python -m attnserve.export.common.quantize --model-dir models/translate-zh-en/2 [--variant fp16]
"""

from __future__ import annotations

import argparse
import json
import pathlib

import onnx

VARIANT = "int8"
VARIANTS = ("int8", "fp16")


def untie_shared_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """Gives each Gemm/MatMul its own copy of a weight that other nodes read too.

    The decoder's output projection is the embedding table itself (tied weights): the quantizer would
    transpose and quantize that one initializer in place, and the embedding lookup would read the result.
    """
    graph = model.graph
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    initializers = {init.name: init for init in graph.initializer}
    for name, nodes in readers.items():
        if name not in initializers or len(nodes) < 2:
            continue
        for node in nodes:
            if node.op_type in ("Gemm", "MatMul"):
                copy = onnx.TensorProto()
                copy.CopyFrom(initializers[name])
                copy.name = f"{name}.{node.name.strip('/').replace('/', '.')}"
                graph.initializer.append(copy)
                node.input[list(node.input).index(name)] = copy.name
    return model


def quantize_folder(model_dir: pathlib.Path, variant: str = VARIANT) -> dict:
    """Writes `<graph>.<variant>.onnx` next to each graph and adds the variant to the manifest; returns the sizes."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}: use one of {', '.join(VARIANTS)}")
    manifest_path = model_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    files = {}
    for graph in ("encoder", "decoder"):
        source = model_dir / manifest[graph]["file"]
        target = source.with_name(f"{source.stem}.{variant}.onnx")
        if variant == "int8":
            _int8(source, target)
        else:
            _float16(source, target)
        files[graph] = target.name
    manifest.setdefault("variants", {})[variant] = files
    manifest_path.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return {name: (model_dir / name).stat().st_size for name in files.values()}


def _int8(source: pathlib.Path, target: pathlib.Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    untied = target.with_suffix(".untied.onnx")
    onnx.save(untie_shared_weights(onnx.load(str(source))), str(untied))
    try:
        # Per-channel scales keep the small matrices of a d=256 model accurate. 7-bit weights (reduce_range):
        # on CPUs without VNNI (AVX2 only), ONNX Runtime's u8 x s8 kernels add pairs of products in 16 bits,
        # which saturate with full-range weights (a tiny M2M100 there: 4 of 20 lines as in float32; 7-bit: 17).
        quantize_dynamic(untied, target, weight_type=QuantType.QInt8, per_channel=True, reduce_range=True,
                         op_types_to_quantize=["MatMul", "Gemm", "Gather"])
    finally:
        untied.unlink()


def _float16(source: pathlib.Path, target: pathlib.Path) -> None:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    # keep_io_types: feeds and outputs stay float32, so the manifest's dtypes and the host cache hold.
    onnx.save(convert_float_to_float16(onnx.load(str(source)), keep_io_types=True), str(target))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=pathlib.Path, required=True, help="an exported version folder")
    parser.add_argument("--variant", choices=VARIANTS, default=VARIANT)
    args = parser.parse_args()
    for name, size in quantize_folder(args.model_dir, args.variant).items():
        print(f"{args.model_dir / name}: {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
