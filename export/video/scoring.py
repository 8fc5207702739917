"""Clip caption scores: exact match and BLEU (export/image/scoring.py), temporal and spatial pointing.

Attention is read as (words, T, G): each word's weights over the T frames' G cells (frame-major columns).

Temporal pointing: every verb word of a generated caption ("jumps", "leaves") is one trial; its score is the
share of the word's attention mass that falls on the frames inside that verb's action window (the clip's
ground truth). A verb the clip does not hold scores 0. Chance is the share of frames inside the window: what
attention spread evenly over the clip would score.

Spatial pointing: every word of an object's name is one trial, as for images; it hits when the (frame, cell)
the word attended to most has its centre inside the box of an object of that name visible in that frame.
Chance is the share of (frame, cell) positions that would hit. `overlap=True` counts a hit when the cell
merely overlaps the box (the looser reading the image captioner reports beside).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from attnserve.export.image.scoring import bleu, exact_match, mentions
from attnserve.export.video.clips import VERBS, Clip, action_frames, sample_times

__all__ = ["bleu", "exact_match", "spatial_trials", "temporal_trials"]


@dataclasses.dataclass(frozen=True)
class TemporalTrial:
    verb: str
    # Share of the word's attention inside the action frames, and of the frames themselves (chance).
    mass: float
    chance: float


@dataclasses.dataclass(frozen=True)
class SpatialTrial:
    name: str
    hit: bool
    chance: float


def temporal_trials(words: Sequence[str], attention: np.ndarray, clip: Clip) -> list[TemporalTrial]:
    """One trial per verb word; attention (words, T, G)."""
    frames = attention.shape[1]
    times = sample_times(clip.duration, frames)
    windows = {verb: window for verb, _, window in clip.verbs}
    trials = []
    for p, word in enumerate(words):
        if word not in VERBS or p >= len(attention):
            continue
        if word not in windows:
            trials.append(TemporalTrial(word, 0.0, 0.0))
            continue
        inside = action_frames(windows[word], times)
        per_frame = attention[p].sum(-1)  # (T,)
        trials.append(TemporalTrial(word, float(per_frame[inside].sum() / max(per_frame.sum(), 1e-9)),
                                    float(inside.mean())))
    return trials


def spatial_trials(words: Sequence[str], attention: np.ndarray, clip: Clip, grid: int, overlap: bool = False
                   ) -> list[SpatialTrial]:
    """One trial per object-name word; attention (words, T, grid * grid)."""
    frames = attention.shape[1]
    times = sample_times(clip.duration, frames)
    hits = [_hit_cells(clip, float(t), grid, overlap) for t in times]  # per frame: name -> (G,) bool
    trials = []
    for name, positions in mentions(words):
        where = np.stack([h.get(name, np.zeros(grid * grid, bool)) for h in hits])  # (T, G)
        for p in positions:
            if p >= len(attention):
                continue
            t, g = np.unravel_index(int(np.argmax(attention[p])), attention[p].shape)
            trials.append(SpatialTrial(name, bool(where[t, g]), float(where.mean())))
    return trials


def _hit_cells(clip: Clip, t: float, grid: int, overlap: bool) -> dict[str, np.ndarray]:
    """Name -> (grid * grid,) whether each cell's centre lies in (or the cell overlaps) a visible box of that
    name at time t."""
    lo = np.arange(grid) / grid
    cx, cy = np.meshgrid(lo, lo)  # (grid, grid): each cell's left and top edge
    out: dict[str, np.ndarray] = {}
    for name, (x0, y0, x1, y1) in clip.boxes(t):
        if overlap:
            inside = (cx < x1) & (cx + 1 / grid > x0) & (cy < y1) & (cy + 1 / grid > y0)
        else:
            mx, my = cx + 0.5 / grid, cy + 0.5 / grid
            inside = (mx >= x0) & (mx < x1) & (my >= y0) & (my < y1)
        inside = inside.reshape(-1)
        out[name] = out.get(name, np.zeros_like(inside)) | inside
    return out
