"""An imported ViT + GPT-2 captioner at nlpconnect/vit-gpt2-image-captioning's real sizes, served by attnserve's
engine against transformers' own `generate` on the same pictures.

    .venv/bin/python bench/import_vit_gpt2.py --work /work/data/vit-gpt2-bench [--pictures 16]

The checkpoint has the published sizes (ViT-base at 224 x 224 with 16-pixel patches, GPT-2 124M, 50,257
tokens; tests/tiny_vit_gpt2.py with `real_sizes`) and random weights (no hub access here). It is imported with
`attnserve import`. Then, greedy, at most 19 new tokens (the published max_length 20), one intra-op thread on
both sides, side by side in one run:
- outputs: every picture through the engine (all submitted at once, as one batch) and through
  `generate(pixel_values=...)` on the processor's pixels, compared token by token;
- time for the whole batch on each side (best of --repeats), captions/s and the ratio;
- the import time, the graphs' sizes and the engine's load time.
Results go to bench/results/import_vit_gpt2.json.
"""

from __future__ import annotations

import argparse
import io
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))  # tiny_vit_gpt2.py

import numpy as np  # noqa: E402

NAME = "vit-gpt2-random"
MAX_NEW = 19


def prepare(work: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path, dict]:
    """Builds and imports the checkpoint once (kept under --work); returns the folders and times."""
    import tiny_vit_gpt2

    from attnserve.export.importers.command import import_checkpoint

    checkpoint, repo = work / "checkpoint", work / "repository"
    times = {}
    if not (checkpoint / "model.safetensors").is_file():
        tiny_vit_gpt2.build(checkpoint, real_sizes=True)
    if not (repo / NAME / "1" / "manifest.json").is_file():
        started = time.perf_counter()
        import_checkpoint(checkpoint, repo, NAME, 1)
        times["import_s"] = round(time.perf_counter() - started, 1)
    return checkpoint, repo, times


def transformers_side(checkpoint: pathlib.Path, pictures: list[bytes], repeats: int) -> tuple[list[list[int]], float]:
    import torch
    from PIL import Image

    import tiny_vit_gpt2

    torch.set_num_threads(1)
    model = tiny_vit_gpt2.transformers_model(checkpoint)
    processor = tiny_vit_gpt2.transformers_processor(checkpoint)
    eos = model.config.eos_token_id
    best, out = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()  # the processor's resizing is part of the work, as the server's is
        images = [Image.open(io.BytesIO(p)).convert("RGB") for p in pictures]
        pixels = torch.from_numpy(processor(images=images, return_tensors="np")["pixel_values"])
        with torch.no_grad():
            out = model.generate(pixel_values=pixels, max_new_tokens=MAX_NEW, num_beams=1, do_sample=False)
        best = min(best, time.perf_counter() - started)
    rows = [r[1:].tolist() for r in out]
    return [r[: r.index(eos)] if eos in r else r for r in rows], best


def attnserve_side(repo: pathlib.Path, pictures: list[bytes], repeats: int) -> tuple[list[list[int]], float, float]:
    from attnserve.server.engine.batcher import BatchingOptions
    from attnserve.server.engine.registry import load_engine
    from attnserve.api.generation import DecodingOptions, GenerationRequest, ImageInput
    from attnserve.server.model.repository import find_models
    from attnserve.server.model.runtime import RuntimeOptions

    started = time.perf_counter()
    engine = load_engine(find_models(repo)[NAME], RuntimeOptions(), BatchingOptions())
    load_s = time.perf_counter() - started
    requests = [GenerationRequest(NAME, target_language="en", decoding=DecodingOptions(MAX_NEW, 1),
                                  image=ImageInput(p)) for p in pictures]
    try:
        best, results = float("inf"), None
        for _ in range(repeats):
            started = time.perf_counter()
            results = [f.result(600) for f in [engine.submit(r) for r in requests]]
            best = min(best, time.perf_counter() - started)
    finally:
        engine.close()
    return [[t.id for t in r.tokens] for r in results], best, load_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=pathlib.Path, required=True, help="folder for the checkpoint and repository")
    parser.add_argument("--pictures", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=pathlib.Path,
                        default=pathlib.Path(__file__).resolve().parent / "results" / "import_vit_gpt2.json")
    args = parser.parse_args()
    import tiny_vit_gpt2

    checkpoint, repo, times = prepare(args.work)
    pictures = [tiny_vit_gpt2.image(seed, 320, 240) for seed in range(args.pictures)]
    served, served_s, load_s = attnserve_side(repo, pictures, args.repeats)
    reference, reference_s = transformers_side(checkpoint, pictures, args.repeats)
    folder = repo / NAME / "1"
    report = {
        "pictures": len(pictures), "max_new_tokens": MAX_NEW, "threads": 1,
        "identical": sum(a == b for a, b in zip(served, reference)),
        "tokens": int(sum(len(r) for r in served)),
        "attnserve_s": round(served_s, 2), "transformers_s": round(reference_s, 2),
        "attnserve_captions_per_s": round(len(pictures) / served_s, 2),
        "transformers_captions_per_s": round(len(pictures) / reference_s, 2),
        "speed_ratio": round(reference_s / served_s, 2),
        "engine_load_s": round(load_s, 1), **times,
        "graph_mb": {p.name: round(p.stat().st_size / 2**20, 1) for p in sorted(folder.glob("*.onnx"))},
        "caption_lengths": [len(r) for r in served],
        "mean_length": float(np.mean([len(r) for r in served])),
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
