"""Writes the clip captioner's card (README.md next to its version folders) from what was measured.

    python -m attnserve.export.video.model_card --checkpoint RUN/best.pt --scores models/caption-video/scores.json \\
        --parity models/caption-video/parity.json --model-dir models/caption-video/1

Training time and the dev history come from the checkpoint, scores from `attnserve.export.video.evaluate`,
parity from the exporter's output.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch

from attnserve.export.common.model_card import size_table, write_card
from attnserve.export.video import clips
from attnserve.export.video.model import VideoCaptionerConfig

TARGETS = {"exact": (0.9, 0.8), "temporal": 0.7, "spatial": 0.8}


def score_lines(scores: dict) -> list[str]:
    lines = ["| split | clips | exact match | BLEU | temporal pointing (verbs) | chance | spatial pointing (names) "
             "| chance | cell overlaps box | chance |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in scores["splits"].items():
        lines.append(f"| {name} | {s['clips']:,} | {s['exact']:.1%} | {s['bleu']:.1f} | {s['temporal_pointing']:.1%} "
                     f"({s['temporal_trials']:,} verbs) | {s['temporal_chance']:.1%} | {s['spatial_pointing']:.1%} "
                     f"({s['spatial_trials']:,} name words) | {s['spatial_chance']:.1%} "
                     f"| {s['spatial_pointing_overlap']:.1%} | {s['spatial_overlap_chance']:.1%} |")
    events = sorted({e for s in scores["splits"].values() for e in s["exact_by_event"]})
    lines += ["", "| split | " + " | ".join(events) + " |", "|---|" + "---|" * len(events)]
    for name, s in scores["splits"].items():
        lines.append(f"| {name} | " + " | ".join(f"{s['exact_by_event'][e]:.0%}" if e in s["exact_by_event"] else "-"
                                                 for e in events) + " |")
    verbs = sorted({v for s in scores["splits"].values() for v in s["temporal_by_verb"]})
    lines += ["", "Temporal pointing by verb:", "", "| split | " + " | ".join(verbs) + " |", "|---|" + "---|" * len(verbs)]
    for name, s in scores["splits"].items():
        lines.append(f"| {name} | " + " | ".join(f"{s['temporal_by_verb'][v]:.0%}" if v in s["temporal_by_verb"]
                                                 else "-" for v in verbs) + " |")
    return lines


def example_lines(scores: dict, split: str = "test") -> list[str]:
    lines = []
    for e in scores["splits"][split]["examples"]:
        mark = "right" if e["hypothesis"] == e["reference"] else "wrong"
        lines += [f"- `{e['id']}` ({mark}): reference \"{e['reference']}\", model \"{e['hypothesis']}\"; frames at "
                  + ", ".join(f"{t:.2f}" for t in e["frame_seconds"]) + " s; action frames "
                  + "; ".join(f"{v}: {''.join(map(str, m))}" for v, m in e["action_frames"].items())]
        lines += [f"  - {w.split(':', 1)[1]}: " + " ".join(f"{v:.2f}" for v in tl) for w, tl in e["timelines"].items()]
    return lines


def card(ckpt: dict, scores: dict, parity: dict, model_dir: pathlib.Path) -> str:
    lines = [
        f"# caption-video (version {model_dir.name})", "",
        "An English captioner of short animated emoji clips: show, attend and tell in time. Each caption word comes "
        "with its attention over every (frame, cell) of the clip, so a verb shows *when* the model looked and a "
        "noun *where*. Trained from scratch on one thread of a shared 2-core CPU, on synthetic clips only "
        "(export/video/clips.py): it knows 20 emoji and 10 events and nothing else.", "",
        *model_section(ckpt),
        *training_section(ckpt["state"]),
        *data_section(),
        "## Scores (served: each clip an MP4/H.264 file of 96 x 96 pixels at 12 fps, greedy)", "",
        *score_lines(scores), "",
        "Temporal pointing: each verb word of a generated caption is a trial, scored by the share of its attention "
        "mass on the frames inside that verb's action window; chance is the share of frames inside it (attention "
        "spread evenly). Spatial pointing: each word of an object's name hits when its most-attended (frame, cell) "
        "has its centre in that object's box in that frame (or, the looser reading, overlaps it); chance is the share "
        "of positions that would hit. A "
        "word naming an object (or a verb) the clip does not hold scores 0.", "",
        "## Examples (test split): each word's attention per frame", "", *example_lines(scores), "",
        "## Parity (ONNX Runtime against PyTorch, largest absolute difference)", "",
        "| output | max abs diff |", "|---|---|", *[f"| {k} | {v:.1e} |" for k, v in parity["max_abs_diff"].items()], "",
        f"at (batch, frames) = {', '.join(map(str, parity['parity_shapes']))}, the decoder chained 6 steps.", "",
        *size_table(model_dir),
    ]
    return "\n".join(lines) + "\n"


def model_section(ckpt: dict) -> list[str]:
    cfg = ckpt["config"]
    grid = VideoCaptionerConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items()}).grid
    parameters = sum(v.numel() for k, v in ckpt["model"].items() if not k.startswith(("presence", "action")))
    return [
        "## Model",
        f"- Frames: the server samples {cfg['frames']} frames per clip (the one showing at the middle of each of "
        f"{cfg['frames']} equal stretches) and squeezes each to {cfg['frame_size']} x {cfg['frame_size']} RGB.",
        f"- Per frame: the image captioner's encoder (a stride-2 3x3 convolution of {cfg['stem']} channels, "
        f"{len(cfg['stages'])} stages of 3x3 convolution + 2x2 max-pool ({', '.join(map(str, cfg['stages']))} "
        f"channels), {cfg['grid_convs']} 3x3 convolutions on the grid, a 1x1 projection to {cfg['feature_dim']}) "
        f"gives a {grid} x {grid} grid of cells with a learned position embedding per cell.",
        f"- Over frames: each frame's grid, linearly summarised ({cfg['summary_dim']}), joined with its change since "
        f"the previous frame, goes through a BiLSTM ({cfg['temporal_hidden']} units each way, two exported LSTMs); "
        "its state at each frame, projected, is added to every cell of that frame.",
        f"- Speller: the image captioner's LSTM cell ({cfg['decoder_hidden']} units) with additive attention over "
        f"all (frame, cell) positions, a gate on the context and a deep output layer; {cfg['vocab_size']} output ids "
        f"(whole words + 4 specials); {parameters / 1e6:.2f}M parameters exported.",
        "- Limits (manifest): 10 s, 16 MiB, 1920 x 1080 pixels a frame, 600 frames a file.", "",
    ]


def training_section(state: dict) -> list[str]:
    best = max(state["history"], key=lambda h: h["exact"])
    return [
        "## Training",
        f"- {state['step']:,} steps of 32 clips, {state['clips']:,} clips seen (none twice: each drawn from its "
        f"own seed), {state['seconds'] / 60:.0f} minutes of compute on one thread "
        f"({state['clips'] / max(state['seconds'], 1):.0f} clips/s on a machine shared with 5 other jobs).",
        "- Loss: word cross-entropy (label smoothing 0.05) + 0.5 x a training-only per-frame presence head (each "
        "object's best cell in a frame against the objects visible in it) + 0.1 x a training-only per-frame "
        "action head (an action window covers the frame); the first 901 steps used a whole-clip presence head at "
        "0.1. Adam, warm-up then inverse-square-root decay. 20% of the clips drawn at twice the size and resized "
        "as the server resizes.",
        f"- Selected by dev exact match (400 clips): {best['exact']:.1%} at step {best['step']:,} (temporal "
        f"pointing {best['temporal']:.1%}, spatial {best['spatial']:.1%}). Script: "
        "`python -m attnserve.export.video.train`.", "",
    ]


def data_section() -> list[str]:
    held = sorted(clips.held_out_pairs(1))
    return [
        "## Data", "",
        "Clips of 1 to 3 s on a solid or gradient background, with or without noise: one object that jumps, falls, "
        "appears, disappears, grows, shrinks or moves across (\"a dog moves from left to right\"), or two objects: "
        "one jumps over the other, passes it (\"a taxi passes a star from right to left\"), or appears after the "
        "other leaves. Each verb's action takes 30-50% of the clip (two windows of 22-32% for \"appears after ... "
        "leaves\"), covering at least two of the model's frames; before and after it the objects stand still. "
        "Splits by seed (train, dev, test); the compositional split shows only (verb, doer) pairs that no other "
        f"split shows, two objects per verb ({len(held)} pairs): "
        + ", ".join(f"{o} {v}" for v, o in held) + ".", "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=pathlib.Path, required=True)
    parser.add_argument("--scores", type=pathlib.Path, required=True)
    parser.add_argument("--parity", type=pathlib.Path, required=True)
    parser.add_argument("--model-dir", type=pathlib.Path, required=True)
    args = parser.parse_args()
    ckpt = torch.load(args.checkpoint, map_location="cpu", weights_only=False)
    text = card(ckpt, json.loads(args.scores.read_text()), json.loads(args.parity.read_text()), args.model_dir)
    write_card(args.model_dir.parent / "README.md", text)  # keeps a "How each version was made" section


if __name__ == "__main__":
    main()
