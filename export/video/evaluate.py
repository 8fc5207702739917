"""Scores an exported clip captioner through the serving engine (video decoding, sampling, ONNX Runtime,
batching): exact match, BLEU, temporal and spatial pointing on clip splits, overall and per event.

    python -m attnserve.export.video.evaluate --model-dir models/caption-video/1 --splits test compositional \\
        --count 1000 --out models/caption-video/scores.json

Every clip is drawn again from its seed (export/video/clips.py) and sent as a client sends it: a video file
(`--container`, default MP4/H.264) of `--size` pixels at `--fps`, which the server decodes, resizes and samples.
The served attention, (words, frames x cells), gives the pointing trials (export/video/scoring.py), each beside
its chance level (attention spread evenly over the clip; a random (frame, cell)).
"""

from __future__ import annotations

import argparse
import collections
import pathlib

import numpy as np

from attnserve.export.video import clips, scoring
from attnserve.export.video.render import FrameRenderer, clip_file
from attnserve.export.common.reports import emit


def draw_split(split: str, count: int, seed: int = 1) -> tuple[list[clips.Clip], FrameRenderer]:
    from attnserve.export.image import objects

    sprites = objects.render_sprites(objects=clips.OBJECT_SET)
    aspect = {name: s.shape[0] / s.shape[1] for name, s in sprites.items()}
    sampler = clips.ClipSampler(aspect, clips.held_out_pairs(seed), compositional=split == "compositional")
    return clips.generate(sampler, seed, split, 0, count), FrameRenderer(sprites)


def caption_all(engine, files: list[bytes], chunk: int = 64) -> list:
    """Served results (attention at word granularity) in clip order."""
    from attnserve.api.generation import AttentionGranularity, AttentionOptions, GenerationRequest, VideoInput

    options = AttentionOptions(enabled=True, granularity=AttentionGranularity.WORDS)
    results = []
    for begin in range(0, len(files), chunk):  # stay under the batcher's queue bound
        futures = [engine.submit(GenerationRequest(engine.manifest.name, video=VideoInput(f), attention=options))
                   for f in files[begin : begin + chunk]]
        results += [f.result() for f in futures]
    return results


def attention_of(result, cells: int) -> np.ndarray:
    """(words, frames, cells) of a served result."""
    rows = len(result.attention.row_labels)
    return np.asarray(result.attention.weights, dtype=np.float32).reshape(rows, -1, cells)


def score_split(hypotheses: list[str], attentions: list[np.ndarray], drawn: list[clips.Clip], grid: int) -> dict:
    references = [c.caption for c in drawn]
    temporal, spatial, overlap = [], [], []
    for text, attention, clip in zip(hypotheses, attentions, drawn):
        temporal += scoring.temporal_trials(text.split(), attention, clip)
        spatial += scoring.spatial_trials(text.split(), attention, clip, grid)
        overlap += scoring.spatial_trials(text.split(), attention, clip, grid, overlap=True)
    events = collections.defaultdict(list)
    for i, clip in enumerate(drawn):
        events[clip.event].append(i)
    verbs = collections.defaultdict(list)
    for t in temporal:
        verbs[t.verb].append(t.mass)
    return {
        "clips": len(drawn),
        "exact": scoring.exact_match(hypotheses, references),
        "bleu": scoring.bleu(hypotheses, references),
        "temporal_pointing": _mean([t.mass for t in temporal]),
        "temporal_chance": _mean([t.chance for t in temporal]),
        "temporal_trials": len(temporal),
        "temporal_by_verb": {v: _mean(m) for v, m in sorted(verbs.items())},
        "spatial_pointing": _mean([t.hit for t in spatial]),
        "spatial_chance": _mean([t.chance for t in spatial]),
        "spatial_pointing_overlap": _mean([t.hit for t in overlap]),
        "spatial_overlap_chance": _mean([t.chance for t in overlap]),
        "spatial_trials": len(spatial),
        "exact_by_event": {e: scoring.exact_match([hypotheses[i] for i in ids], [references[i] for i in ids])
                           for e, ids in sorted(events.items())},
        "errors": [{"id": drawn[i].id, "reference": references[i], "hypothesis": hypotheses[i]}
                   for i in range(len(drawn)) if hypotheses[i] != references[i]][:12],
        "examples": examples(hypotheses, attentions, drawn),
    }


def examples(hypotheses: list[str], attentions: list[np.ndarray], drawn: list[clips.Clip], right: int = 3,
             wrong: int = 3) -> list[dict]:
    """The first `right` correct and `wrong` mistaken captions, each word with its timeline (attention per
    frame), beside the clip's action frames per verb."""
    chosen = ([i for i, c in enumerate(drawn) if hypotheses[i] == c.caption][:right]
              + [i for i, c in enumerate(drawn) if hypotheses[i] != c.caption][:wrong])
    out = []
    for i in chosen:
        clip = drawn[i]
        times = clips.sample_times(clip.duration, attentions[i].shape[1])
        out.append({
            "id": clip.id, "reference": clip.caption, "hypothesis": hypotheses[i],
            "frame_seconds": [round(float(t), 3) for t in times],
            "action_frames": {v: clips.action_frames(w, times).astype(int).tolist() for v, _, w in clip.verbs},
            "timelines": {f"{k}:{w}": [round(float(v), 3) for v in attentions[i][k].sum(-1)]
                          for k, w in enumerate(hypotheses[i].split())},
        })
    return out


def _mean(values) -> float | None:
    return float(np.mean(values)) if len(values) else None


def evaluate(engine, split: str, count: int, container: str = "mp4", size: int = 96, fps: int = 12) -> dict:
    drawn, renderer = draw_split(split, count)
    files = [clip_file(renderer, c, size, fps, container) for c in drawn]
    results = caption_all(engine, files)
    cells = engine.info.video.grid_rows * engine.info.video.grid_cols
    scores = score_split([r.text for r in results], [attention_of(r, cells) for r in results], drawn,
                         engine.info.video.grid_cols)
    return {"container": container, "size": size, "fps": fps, **scores}


def main() -> None:
    from attnserve.export.common.serving import open_engine

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=pathlib.Path, required=True)
    parser.add_argument("--splits", nargs="+", default=["test", "compositional"])
    parser.add_argument("--count", type=int, default=1000, help="clips of each split")
    parser.add_argument("--container", default="mp4", choices=["mp4", "webm", "webm-vp8", "gif"])
    parser.add_argument("--size", type=int, default=96, help="side of the files' frames, in pixels")
    parser.add_argument("--fps", type=int, default=12)
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    engine = open_engine(args.model_dir)
    try:
        scores = {"model": str(args.model_dir), "splits": {
            s: evaluate(engine, s, args.count, args.container, args.size, args.fps) for s in args.splits}}
    finally:
        engine.close()
    emit(scores, args.out)


if __name__ == "__main__":
    main()
