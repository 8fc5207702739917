"""Starts a clip captioner from another's checkpoint (version 1's), even across the frame grid.

Same config: the weights are copied as they are. From the 6 x 6 grid to the image captioner's `fine_grid`
(export/image/model.py: the deep features, upsampled, joined with the last stage's input), the new model starts
as the old one run on a grid of copies, so it keeps what it knew and only has to learn to tell a coarse cell's
four quarters apart:

  early, deep     the old encoder's layers, in order, split where the fine grid joins;
  join            the new 3x3 convolution passes the upsampled deep features through (identity on the centre
                  tap, nothing yet from the finer features), its batch norm set to undo its own normalisation
                  on the given clips' statistics;
  position        each coarse cell's embedding on its four fine cells, plus small 2-D sinusoids that tell them
                  apart;
  summary         the BiLSTM's frame summary spread over the four copies of each cell (a quarter each).

The speller reads the same context: four equal copies of a cell share the weight the cell had.
"""

from __future__ import annotations

import torch

from attnserve.export.image.model import grid_sinusoids
from attnserve.export.video.model import VideoShowAttendTell


def adapted_state(old: VideoShowAttendTell, new: VideoShowAttendTell, frames: torch.Tensor,
                  jitter: float = 0.02) -> dict:
    """The new model's state dict from the old model's; `frames` (B, T, 3, H, W) set the join's statistics,
    `jitter` scales the sinusoids that tell a cell's quarters apart (0: the new model computes what the old did)."""
    source = old.state_dict()
    if not new.cfg.fine_grid or old.cfg.fine_grid:  # same grid: new layers (local_keys') keep their start
        return {**new.state_dict(), **source}
    early, deep = len(new.frame_encoder.early), len(new.frame_encoder.deep)
    state = dict(new.state_dict())
    for key, value in source.items():
        state[_renamed(key, early, deep)] = value
    g, d = old.cfg.grid, old.cfg.feature_dim
    position = source["frame_encoder.position"].view(g, g, d)
    state["frame_encoder.position"] = (_doubled(position).reshape(-1, d)
                                       + jitter * grid_sinusoids(2 * g, d))
    summary = source["temporal.summary.weight"].view(-1, g, g, d)
    state["temporal.summary.weight"] = _doubled(summary, first=1).reshape(summary.shape[0], -1) / 4
    state.update(_pass_through_join(old, new, frames))
    return state


def _renamed(key: str, early: int, deep: int) -> str:
    """frame_encoder.net.i.* of the coarse encoder -> early / deep (their first `early` and next `deep`
    layers) / the fine net's projection."""
    prefix = "frame_encoder.net."
    if not key.startswith(prefix):
        return key
    index, rest = key[len(prefix):].split(".", 1)
    i = int(index)
    if i < early:
        return f"frame_encoder.early.{i}.{rest}"
    if i < early + deep:
        return f"frame_encoder.deep.{i - early}.{rest}"
    return f"frame_encoder.net.{i - early - deep + 3}.{rest}"  # after the join's conv, norm, ReLU


def _doubled(x: torch.Tensor, first: int = 0) -> torch.Tensor:
    """(..., g, g, ...) -> (..., 2g, 2g, ...), the grid at dims `first` and `first + 1`: every cell on its four
    quarters."""
    return x.repeat_interleave(2, dim=first).repeat_interleave(2, dim=first + 1)


@torch.no_grad()
def _pass_through_join(old: VideoShowAttendTell, new: VideoShowAttendTell, frames: torch.Tensor) -> dict:
    """The join's conv and batch norm, set so that they hand on the deep features unchanged."""
    conv, norm = new.frame_encoder.net[0], new.frame_encoder.net[1]
    deep_channels = conv.out_channels
    weight = torch.zeros_like(conv.weight)
    weight[torch.arange(deep_channels), torch.arange(deep_channels), 1, 1] = 1.0
    # The old encoder's features before its projection: what the join passes on.
    x = old.frame_encoder.net[: len(old.frame_encoder.net) - 2](frames.flatten(0, 1))  # (B*T, C, g, g)
    mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False)
    return {"frame_encoder.net.0.weight": weight,
            "frame_encoder.net.1.weight": (var + norm.eps).sqrt(), "frame_encoder.net.1.bias": mean,
            "frame_encoder.net.1.running_mean": mean, "frame_encoder.net.1.running_var": var}
