"""Scores an exported captioner through the serving engine (PNG decoding, resizing, ONNX Runtime, dynamic
batching): exact match, BLEU and pointing accuracy on scene splits, overall and per scene kind.

    python -m attnserve.export.image.evaluate --model-dir models/caption-emoji/1 --corpus data/scenes \\
        --splits test compositional --out models/caption-emoji/scores.json

Every image is sent as a PNG file, as a client sends it; the served attention (one row per word, one column
per grid cell) gives the pointing trials (export/image/scoring.py). Beside pointing accuracy stands its
chance level: the share of cells that would hit, averaged over the same trials (a model that looks at a
random cell scores it).
"""

from __future__ import annotations

import argparse
import collections
import io
import pathlib

import numpy as np

from attnserve.export.image import scoring
from attnserve.export.image.build import load_split
from attnserve.export.image.scenes import Scene
from attnserve.export.common.reports import emit


def png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def caption_all(engine, images: np.ndarray, chunk: int = 128) -> list:
    """Served results (attention at word granularity) in image order."""
    from attnserve.api.generation import AttentionGranularity, AttentionOptions, GenerationRequest, ImageInput

    options = AttentionOptions(enabled=True, granularity=AttentionGranularity.WORDS)
    results = []
    for begin in range(0, len(images), chunk):  # stay under the batcher's queue bound
        futures = [engine.submit(GenerationRequest(engine.manifest.name, image=ImageInput(png(x)), attention=options))
                   for x in images[begin : begin + chunk]]
        results += [f.result() for f in futures]
    return results


def chance(words: list[str], scene: Scene, grid: int) -> list[float]:
    """Per pointing trial, the share of cells that would hit."""
    return [scoring.hit_share(name, scene, grid) for name, positions in scoring.mentions(words) for _ in positions]


def score_split(hypotheses: list[str], attentions: list[np.ndarray], scenes: list[Scene], grid: int) -> dict:
    references = [s.caption for s in scenes]
    centre, overlap, random_cell = [], [], []
    for text, attention, scene in zip(hypotheses, attentions, scenes):
        words = text.split()
        centre += scoring.pointing_trials(words, attention, scene, grid)
        overlap += scoring.pointing_trials(words, attention, scene, grid, overlap=True)
        random_cell += chance(words, scene, grid)
    kinds = collections.defaultdict(list)
    for i, scene in enumerate(scenes):
        kinds[scene.kind].append(i)
    return {
        "images": len(scenes),
        "exact": scoring.exact_match(hypotheses, references),
        "bleu": scoring.bleu(hypotheses, references),
        "pointing": float(np.mean(centre)) if centre else None,
        "pointing_overlap": float(np.mean(overlap)) if overlap else None,
        "pointing_chance": float(np.mean(random_cell)) if random_cell else None,
        "pointing_trials": len(centre),
        "exact_by_kind": {k: scoring.exact_match([hypotheses[i] for i in ids], [references[i] for i in ids])
                          for k, ids in sorted(kinds.items())},
        "errors": [{"id": scenes[i].id, "reference": references[i], "hypothesis": hypotheses[i]}
                   for i in range(len(scenes)) if hypotheses[i] != references[i]][:10],
    }


def evaluate(engine, corpus: pathlib.Path, split: str, limit: int | None = None) -> dict:
    images, scenes = load_split(corpus, split)
    images, scenes = images[:limit], scenes[:limit]
    results = caption_all(engine, images)
    grid = engine.manifest.input.grid_cols
    attentions = [np.asarray(r.attention.weights, dtype=np.float32).reshape(len(r.attention.row_labels), -1)
                  for r in results]
    return score_split([r.text for r in results], attentions, scenes, grid)


def main() -> None:
    from attnserve.export.common.serving import open_engine

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=pathlib.Path, required=True)
    parser.add_argument("--corpus", type=pathlib.Path, default=pathlib.Path("data/scenes"))
    parser.add_argument("--splits", nargs="+", default=["test", "compositional"])
    parser.add_argument("--limit", type=int, help="score only the first N images of each split")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    engine = open_engine(args.model_dir)
    try:
        scores = {"model": str(args.model_dir), "splits": {s: evaluate(engine, args.corpus, s, args.limit)
                                                             for s in args.splits}}
    finally:
        engine.close()
    emit(scores, args.out)


if __name__ == "__main__":
    main()
