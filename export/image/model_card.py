"""Writes the captioner's card (README.md next to its version folders) from what was measured.

    python -m attnserve.export.image.model_card --checkpoint RUN/best.pt --scores models/caption-emoji/scores.json \\
        --corpus data/scenes --model-dir models/caption-emoji/1 --examples docs/images/caption-emoji

Training time and dev history come from the checkpoint, split sizes and held-out pairs from the corpus's
corpus.json, scores from `attnserve.export.image.evaluate`, parity from the exporter's output.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch

from attnserve.export.common.model_card import size_table, write_card
from attnserve.export.image.model import ShowAttendTellConfig
from attnserve.export.image.objects import OBJECTS

POINTING_TARGET = 0.8  # the aim for strict pointing


def score_lines(scores: dict) -> list[str]:
    lines = ["| split | images | exact match | BLEU | pointing (cell centre in box) | pointing (cell overlaps box) "
             "| pointing by chance |", "|---|---|---|---|---|---|---|"]
    for name, s in scores["splits"].items():
        lines.append(f"| {name} | {s['images']:,} | {s['exact']:.1%} | {s['bleu']:.1f} | {s['pointing']:.1%} "
                     f"({s['pointing_trials']:,} name words) | {s['pointing_overlap']:.1%} "
                     f"| {s['pointing_chance']:.1%} |")
    kinds = sorted({k for s in scores["splits"].values() for k in s["exact_by_kind"]})
    lines += ["", "| split | " + " | ".join(f"exact, {k}" for k in kinds) + " |", "|---|" + "---|" * len(kinds)]
    for name, s in scores["splits"].items():
        by_kind = s["exact_by_kind"]
        lines.append(f"| {name} | " + " | ".join(f"{by_kind[k]:.1%}" if k in by_kind else "-" for k in kinds) + " |")
    return lines


def error_lines(scores: dict) -> list[str]:
    lines = ["| split | scene | reference | model |", "|---|---|---|---|"]
    for name, s in scores["splits"].items():
        lines += [f"| {name} | {e['id']} | {e['reference']} | {e['hypothesis']} |" for e in s["errors"][:5]]
    return lines


def encoder_line(cfg: dict, grid: int, size: int) -> str:
    n = len(cfg["stages"])
    stages = (f"{n} stage{'s' if n > 1 else ''} of 3x3 convolution + 2x2 max-pool"
              f" ({', '.join(map(str, cfg['stages']))} channels)")
    head = (f"- Encoder: {size} x {size} RGB (the server squeezes any PNG or JPEG to it) -> a stride-2 3x3 convolution"
            f" ({cfg['stem']} channels), {stages}")
    if not cfg.get("fine_grid"):
        return (f"{head}, {cfg['grid_convs']} more 3x3 convolutions on the {grid} x {grid} grid, a 1x1 projection to"
                f" {cfg['feature_dim']} features per cell plus a learned position embedding per cell.")
    coarse = grid // 2
    return (f"{head}, {cfg['grid_convs']} more 3x3 convolutions on the {coarse} x {coarse} grid; those deep features"
            f" are upsampled to {grid} x {grid}, joined with the previous stage's output (the fine grid), and a 3x3"
            f" convolution and a 1x1 projection give {cfg['feature_dim']} features per cell plus a learned position"
            " embedding per cell (started as 2-D sinusoids).")


def pointing_lines(scores: dict, cell: float) -> list[str]:
    test = scores["splits"]["test"]
    met = test["pointing"] >= POINTING_TARGET
    return [
        "Pointing: each word of an object's name in the generated caption is a trial; it hits when the cell it",
        "attended to most has its centre inside a box of that object (export/image/scoring.py). Chance is the share",
        "of cells that would hit, over the same trials; the looser reading counts a cell that merely overlaps the",
        f"box. A cell is {cell:g} x {cell:g} pixels of the model's input. On the test split the strict reading is"
        f" {test['pointing']:.1%}: the {POINTING_TARGET:.0%} the issue aimed at is {'met' if met else 'missed'}.",
    ]


def comparison_lines(scores: dict, previous: dict) -> list[str]:
    lines = ["| split | exact match | BLEU | pointing (centre) | pointing (overlap) |", "|---|---|---|---|---|"]
    for name, s in scores["splits"].items():
        p = previous["splits"].get(name)
        if p is None:
            continue
        lines.append(f"| {name} | {p['exact']:.1%} → {s['exact']:.1%} | {p['bleu']:.1f} → {s['bleu']:.1f} | "
                     f"{p['pointing']:.1%} → {s['pointing']:.1%} | {p['pointing_overlap']:.1%} → "
                     f"{s['pointing_overlap']:.1%} |")
    return lines


def render(checkpoint: dict, scores: dict, corpus: dict, parity: dict, model_dir: pathlib.Path,
           previous: dict | None = None) -> str:
    cfg = checkpoint["config"]
    manifest = json.loads((model_dir / "manifest.json").read_text())
    grid = ShowAttendTellConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items()}).grid
    return "\n".join([
        *intro_lines(manifest, grid),
        *model_section(checkpoint, manifest, grid),
        *training_section(checkpoint),
        *data_section(corpus),
        "## Scores (served: PNG files through the engine, greedy)",
        "",
        *score_lines(scores),
        "",
        *pointing_lines(scores, cfg["image_size"] / grid),
        "",
        *([f"## Compared with version {manifest['version'] - 1} (same splits, served)", "",
           *comparison_lines(scores, previous), ""] if previous else []),
        "## Mistakes",
        "",
        *error_lines(scores),
        "",
        "## Parity (max |ONNX Runtime - PyTorch|, batches of 1, 3 and 5 random images, 6 chained decoder steps)",
        "",
        "| output | max abs diff |", "|---|---|",
        *[f"| `{k}` | {v:.1e} |" for k, v in parity.items()],
        "",
        "## Files",
        "",
        *size_table(model_dir),
        "",
    ])


def intro_lines(manifest: dict, grid: int) -> list[str]:
    return [
        f"# {manifest['name']} (version {manifest['version']})",
        "",
        "An English captioner of composed emoji scenes, show, attend and tell (Xu et al. 2015), writing whole words.",
        "Exported to ONNX with the speller's h and c as replaced decoder state and each step's attention as output",
        "(docs/model-contract.md, image input): every caption word comes with its attention over the image's",
        f"{grid} x {grid} grid of cells. Trained from scratch here on one thread of a shared 2-core CPU, on synthetic",
        "scenes only: it knows 40 emoji on plain, gradient or noisy backgrounds and nothing else.",
        "",
    ]


def model_section(checkpoint: dict, manifest: dict, grid: int) -> list[str]:
    cfg = checkpoint["config"]
    params = sum(v.numel() for v in checkpoint["model"].values())
    return [
        "## Model",
        encoder_line(cfg, grid, cfg["image_size"]),
        f"- Speller: one LSTM cell of {cfg['decoder_hidden']} units, additive attention over the {grid * grid} cells"
        " queried by the previous state, the paper's gate on the context, deep output layer;"
        f" {cfg['vocab_size']} output ids (words + 4 specials); {params / 1e6:.2f}M parameters.",
        f"- Limits: {manifest['input']['max_bytes']:,} bytes and {manifest['input']['max_pixels']:,} pixels per image,"
        f" {manifest['limits']['max_new_tokens']} words.",
        "",
    ]


def training_section(checkpoint: dict) -> list[str]:
    state = checkpoint["state"]
    best = max(state["history"], key=lambda h: h["exact"])
    return [
        "## Training",
        f"- {state['step']:,} steps of {checkpoint.get('batch_size', 64)} images, {state['epoch']} epochs +"
        f" {state['batch_in_epoch']:,} batches, {state['images']:,} images seen in {state['seconds'] / 60:.0f}"
        f" minutes of compute ({state['images'] / max(state['seconds'], 1):.0f} images/s on one thread).",
        "- Cross-entropy (label smoothing 0.05) + 0.01 x the doubly stochastic attention regulariser + 0.1 x the"
        " training-only presence head's loss (each object's best cell score against the objects the caption names),"
        " Adam, warm-up then inverse-square-root decay. Selected by dev exact match:"
        f" {best['exact']:.1%} (pointing {best['pointing']:.1%}) at step {best['step']:,}."
        " Script: `python -m attnserve.export.image.train`.",
        "",
    ]


def data_section(corpus: dict) -> list[str]:
    categories = {}
    for o in OBJECTS:
        categories.setdefault(o.category, []).append(o.name)
    splits = ", ".join(f"{k} {v:,}" for k, v in corpus["splits"].items())
    return [
        "## Data",
        "",
        f"`python -m attnserve.export.image.build` (seed {corpus['seed']}): {splits} scenes of 1 to 3 objects out of"
        f" {len(OBJECTS)} Noto Color Emoji named by Unicode CLDR"
        f" ({'; '.join(f'{k}: {len(v)}' for k, v in categories.items())}), on solid or gradient backgrounds with or"
        f" without noise; {corpus['large_share']:.0%} of the training scenes drawn at 128-256 pixels and resized as"
        " the server resizes. Captions follow from the scene graph: \"a small dog\", \"two cats\", \"a dog to the"
        " left of a red apple\" (the left or upper object first), \"two cats below a bus\". The compositional split"
        f" shows only {len(corpus['held_out_pairs'])} object pairs that never appear together in training, dev or"
        " test.",
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=pathlib.Path, required=True)
    parser.add_argument("--scores", type=pathlib.Path, required=True, help="output of attnserve.export.image.evaluate")
    parser.add_argument("--corpus", type=pathlib.Path, default=pathlib.Path("data/scenes"))
    parser.add_argument("--parity", type=pathlib.Path, required=True, help="the exporter's JSON output")
    parser.add_argument("--model-dir", type=pathlib.Path, required=True, help="the exported version folder")
    parser.add_argument("--previous-scores", type=pathlib.Path, help="the previous version's scores, to compare")
    args = parser.parse_args()
    checkpoint = torch.load(args.checkpoint, map_location="cpu", weights_only=False)
    corpus = json.loads((args.corpus / "corpus.json").read_text())
    card = render(checkpoint, json.loads(args.scores.read_text()), corpus,
                  json.loads(args.parity.read_text())["max_abs_diff"], args.model_dir,
                  json.loads(args.previous_scores.read_text()) if args.previous_scores else None)
    write_card(args.model_dir.parent / "README.md", card)


if __name__ == "__main__":
    main()
