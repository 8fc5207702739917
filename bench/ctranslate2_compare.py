"""attnserve against CTranslate2 running the same weights, side by side in one run.

    .venv/bin/pip install -e '.[bench]'             # ctranslate2 (and the export extra: the weights are read with onnx)
    .venv/bin/python bench/ctranslate2_compare.py --sentences 128 --repeats 3 [--int8-models COPY]

The bundled translator's weights are read back out of its ONNX graphs (export/translation/recover_weights.py) and put
into a `ctranslate2.specs.TransformerSpec`: pre-norm, the graphs' own sinusoid table (CTranslate2's default
table orders sines and cosines differently), the embedding shared by encoder, decoder and the output
projection, layer-norm epsilon 1e-5, and no fixed decoder start token (the target language token is the
target prefix, as the manifest's decoder_start says). It is saved as float32 and int8.

First the outputs are compared, greedy, token by token. Then, on the same test sentences (both directions,
one intra-op thread everywhere), each repeat runs every system in turn so that a slow spell on a shared machine
hits all of them:
- `batch_1`: the sentences one at a time;
- `batch_32`: all submitted at once (attnserve: continuous batching, up to 32 rows; CTranslate2:
  `translate_batch` with max_batch_size 32, which sorts by length itself).
The report gives the median seconds, generated tokens per second and every system's speed relative to
CTranslate2 float32. `--int8-models` adds attnserve's int8 variant (a copy of models/ that
`attnserve.export.common.quantize` was run on). PyTorch eager runs the same recovered weights too, for the record
(`Transformer.greedy_decode`, one thread): with its K/V cache, and without (the decoder rerun over the whole
prefix at every step); `batch_32` pads 32 sentences of similar length together. `--no-pytorch` leaves it out.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import tempfile
import time

import ctranslate2
import numpy as np
import torch
from ctranslate2.converters.converter import Converter
from ctranslate2.specs import common_spec, transformer_spec
from tokenizers import Tokenizer

import sentences  # bench/, beside this script

from attnserve.export.translation.model import Transformer, TransformerConfig, sinusoidal_positions
from attnserve.export.translation.recover_weights import recover
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.registry import load_engine
from attnserve.api.generation import GenerationRequest
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions

WAIT = 900  # seconds; only a bound against hanging
LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's default, which the model was trained with


class GraphWeightsConverter(Converter):
    """A CTranslate2 converter whose source is an attnserve Transformer version folder."""

    def __init__(self, model_dir: pathlib.Path):
        self._model_dir = model_dir

    def _load(self):
        checkpoint = recover(self._model_dir)
        cfg = TransformerConfig(**checkpoint["config"])
        w = {k: v.numpy() for k, v in checkpoint["model"].items()}
        spec = transformer_spec.TransformerSpec.from_config(
            (cfg.encoder_layers, cfg.decoder_layers), cfg.heads, pre_norm=True,
            activation=common_spec.Activation.RELU,
        )
        spec.config.layer_norm_epsilon = LAYER_NORM_EPSILON
        spec.config.decoder_start_token = None  # the target language token comes as the target prefix
        spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = "<unk>", "<s>", "</s>"
        table = sinusoidal_positions(cfg.max_positions, cfg.d_model).numpy()
        for side, final_norm in ((spec.encoder, "encoder_norm"), (spec.decoder, "decoder_norm")):
            embeddings = side.embeddings[0] if isinstance(side.embeddings, list) else side.embeddings
            embeddings.weight = w["embed.weight"]
            side.scale_embeddings = True  # x sqrt(d_model), as Transformer.embed_tokens
            side.position_encodings.encodings = table
            _norm(side.layer_norm, w, final_norm)
        spec.decoder.projection.weight = w["embed.weight"]
        spec.decoder.projection.bias = np.zeros(cfg.vocab_size, dtype=np.float32)
        for i, layer in enumerate(spec.encoder.layer):
            prefix = f"encoder_layers.{i}"
            _self_attention(layer.self_attention, w, f"{prefix}.self_attn", f"{prefix}.norm1")
            _feed_forward(layer.ffn, w, prefix, "norm2")
        for i, layer in enumerate(spec.decoder.layer):
            prefix = f"decoder_layers.{i}"
            _self_attention(layer.self_attention, w, f"{prefix}.self_attn", f"{prefix}.norm1")
            cross = f"{prefix}.cross_attn"
            _linear(layer.attention.linear[0], w, f"{cross}.q_proj")
            _fused(layer.attention.linear[1], w, [f"{cross}.k_proj", f"{cross}.v_proj"])
            _linear(layer.attention.linear[2], w, f"{cross}.out_proj")
            _norm(layer.attention.layer_norm, w, f"{prefix}.norm2")
            _feed_forward(layer.ffn, w, prefix, "norm3")
        vocabulary = pieces(self._model_dir)
        spec.register_source_vocabulary(vocabulary)
        spec.register_target_vocabulary(vocabulary)
        return spec


def _linear(spec, w, name):
    spec.weight, spec.bias = w[f"{name}.weight"], w[f"{name}.bias"]


def _fused(spec, w, names):
    spec.weight = np.concatenate([w[f"{n}.weight"] for n in names])
    spec.bias = np.concatenate([w[f"{n}.bias"] for n in names])


def _norm(spec, w, name):
    spec.gamma, spec.beta = w[f"{name}.weight"], w[f"{name}.bias"]


def _self_attention(spec, w, name, norm):
    _fused(spec.linear[0], w, [f"{name}.q_proj", f"{name}.k_proj", f"{name}.v_proj"])
    _linear(spec.linear[1], w, f"{name}.out_proj")
    _norm(spec.layer_norm, w, norm)


def _feed_forward(spec, w, prefix, norm):
    _norm(spec.layer_norm, w, f"{prefix}.{norm}")
    _linear(spec.linear_0, w, f"{prefix}.feed_forward.net.0")
    _linear(spec.linear_1, w, f"{prefix}.feed_forward.net.3")


def pieces(model_dir: pathlib.Path) -> list[str]:
    """The tokenizer's pieces in id order (CTranslate2's vocabulary)."""
    manifest = json.loads((model_dir / "manifest.json").read_text())
    tokenizer = Tokenizer.from_file(str(model_dir / manifest["tokenizer"]["file"]))
    return [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())]


class CTranslate2System:
    """The converted model, given the same source pieces and target language token attnserve uses."""

    def __init__(self, model_dir: pathlib.Path, compute_type: str, suppress: list[str], max_new_tokens: int):
        self._translator = ctranslate2.Translator(str(model_dir), device="cpu", compute_type=compute_type,
                                                  intra_threads=1, inter_threads=1)
        self._suppress = [[p] for p in suppress]
        self._max_new_tokens = max_new_tokens

    def translate(self, sources: list[list[str]], starts: list[str]) -> list[list[str]]:
        results = self._translator.translate_batch(
            sources, target_prefix=[[s] for s in starts], beam_size=1, max_batch_size=32,
            max_decoding_length=self._max_new_tokens + 1, suppress_sequences=self._suppress,
        )
        return [r.hypotheses[0] for r in results]  # the language token (the start) is not in them


class PyTorchSystem:
    """The recovered weights in PyTorch eager, greedy (`Transformer.greedy_decode`), with or without its cache."""

    def __init__(self, checkpoint: dict, prepared: list, eos: int, suppress: list[int], max_new_tokens: int,
                 vocabulary: list[str], use_cache: bool):
        self._model = Transformer(TransformerConfig(**checkpoint["config"]))
        self._model.load_state_dict(checkpoint["model"])
        self._model.eval()
        self._prepared, self._eos, self._suppress = prepared, eos, suppress
        self._max_new_tokens, self._vocabulary, self._use_cache = max_new_tokens, vocabulary, use_cache

    def translate(self, together: bool) -> list[list[str]]:
        order = sorted(range(len(self._prepared)), key=lambda i: self._prepared[i].source.length)
        groups = [order[i : i + 32] for i in range(0, len(order), 32)] if together else [[i] for i in order]
        out: list[list[str]] = [[] for _ in self._prepared]
        for group in groups:
            rows = [self._prepared[i] for i in group]
            width = max(p.source.length for p in rows)
            ids = torch.zeros((len(rows), width), dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for r, p in enumerate(rows):
                ids[r, : p.source.length] = torch.tensor(list(p.source.ids))
                mask[r, : p.source.length] = 1
            starts = torch.tensor([p.start_id for p in rows])
            with torch.inference_mode():
                tokens, _ = self._model.greedy_decode(ids, mask, starts, self._eos, self._max_new_tokens,
                                                      use_cache=self._use_cache, suppress_ids=self._suppress)
            for i, row in zip(group, tokens):
                out[i] = [self._vocabulary[t] for t in row]
        return out


class AttnserveSystem:
    def __init__(self, engine):
        self._engine = engine

    def translate(self, requests: list[GenerationRequest], together: bool) -> list[list[str]]:
        if together:
            results = [f.result(WAIT) for f in [self._engine.submit(r) for r in requests]]
        else:
            results = [self._engine.generate(r, WAIT) for r in requests]
        return [[t.piece for t in r.tokens] for r in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sentences.add_arguments(parser, sentences=128)
    parser.add_argument("--int8-models", type=pathlib.Path, help="a copy of --models with the int8 variant")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-pytorch", action="store_true", help="leave PyTorch eager out")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    torch.set_num_threads(1)

    version = find_models(args.models)[args.model]
    manifest = version.manifest
    requests = sentences.requests(args)
    vocabulary = pieces(version.path)
    engines = {"attnserve float32": load_engine(version, RuntimeOptions(), BatchingOptions(max_batch_size=32))}
    if args.int8_models:
        int8 = find_models(args.int8_models)[args.model]
        engines["attnserve int8"] = load_engine(int8, RuntimeOptions(variant="int8"), BatchingOptions(max_batch_size=32))
    # What attnserve feeds its encoder (source pieces, EOS included) and its decoder's first token.
    prepared = [engines["attnserve float32"].prepare(r) for r in requests]
    sources = [[vocabulary[i] for i in p.source.ids] for p in prepared]
    starts = [vocabulary[p.start_id] for p in prepared]
    suppress = [vocabulary[i] for i in manifest.special_tokens.suppress]
    systems = {}
    with tempfile.TemporaryDirectory() as tmp:
        for compute_type in ("float32", "int8"):
            out = pathlib.Path(tmp) / compute_type
            GraphWeightsConverter(version.path).convert(str(out), quantization=compute_type)
            systems[f"ctranslate2 {compute_type}"] = CTranslate2System(
                out, compute_type, suppress, manifest.limits.max_new_tokens)
        systems.update({name: AttnserveSystem(engine) for name, engine in engines.items()})
        if not args.no_pytorch:
            checkpoint = recover(version.path)
            for name, use_cache in (("pytorch eager, cached", True), ("pytorch eager, uncached", False)):
                systems[name] = PyTorchSystem(checkpoint, prepared, manifest.special_tokens.eos,
                                              list(manifest.special_tokens.suppress), manifest.limits.max_new_tokens,
                                              vocabulary, use_cache)

        def run(name: str, together: bool) -> list[list[str]]:
            system = systems[name]
            if isinstance(system, AttnserveSystem):
                return system.translate(requests, together)
            if isinstance(system, PyTorchSystem):
                return system.translate(together)
            if together:
                return system.translate(sources, starts)
            return [system.translate([s], [t])[0] for s, t in zip(sources, starts)]

        times = {(name, mode): [] for name in systems for mode in ("batch_1", "batch_32")}
        outputs = {}
        try:
            for _ in range(args.repeats):
                for mode, together in (("batch_1", False), ("batch_32", True)):
                    for name in systems:
                        started = time.perf_counter()
                        outputs[name, mode] = run(name, together)
                        times[name, mode].append(time.perf_counter() - started)
        finally:
            for engine in engines.values():
                engine.close()

    reference = outputs["attnserve float32", "batch_1"]
    tokens = {key: sum(len(o) for o in out) for key, out in outputs.items()}
    seconds = {key: statistics.median(t) for key, t in times.items()}
    report = {
        "model": f"{version.name}/{version.version}",
        "requests": len(requests),
        "repeats": args.repeats,
        "identical_to_attnserve_float32": {
            f"{name} {mode}": sum(a == b for a, b in zip(reference, outputs[name, mode]))
            for name, mode in outputs
        },
        "seconds": {f"{name} {mode}": s for (name, mode), s in seconds.items()},
        "tokens_per_s": {f"{name} {mode}": tokens[name, mode] / s for (name, mode), s in seconds.items()},
        "speed_vs_ctranslate2_float32": {
            f"{name} {mode}": seconds["ctranslate2 float32", mode] / s for (name, mode), s in seconds.items()
        },
    }
    print(json.dumps(report, indent=2))
    print(f"\n| system | batch_1 tokens/s | batch_32 tokens/s | vs CT2 fp32 (1 / 32) | identical (1 / 32) |")
    print("|---|---|---|---|---|")
    for name in systems:
        row = [f"{report['tokens_per_s'][f'{name} {m}']:.0f}" for m in ("batch_1", "batch_32")]
        ratio = " / ".join(f"{report['speed_vs_ctranslate2_float32'][f'{name} {m}']:.2f}" for m in ("batch_1", "batch_32"))
        same = " / ".join(str(report["identical_to_attnserve_float32"][f"{name} {m}"]) for m in ("batch_1", "batch_32"))
        print(f"| {name} | {row[0]} | {row[1]} | {ratio} | {same} |")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
