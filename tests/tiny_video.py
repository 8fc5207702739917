"""A tiny random-weight clip captioner for the tests: the real model (export/video/model.py) at a toy size
(16 x 16 frames, 4 per clip, a 4 x 4 grid per frame, 16 LSTM units), exported by the real exporter, and
test clips as video files and stills."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

NAME = "tiny-video"
SIDE, FRAMES = 16, 4
# Small limits, so the tests can cross each one cheaply.
LIMITS = {"max_seconds": 4.0, "max_bytes": 400_000, "max_pixels": 320 * 240, "max_frames": 60}


def config(**changes):
    from attnserve.export.video.model import VideoCaptionerConfig

    return VideoCaptionerConfig(**{**dict(frame_size=SIDE, frames=FRAMES, stem=4, stages=(8,), grid_convs=1,
                                          feature_dim=8, summary_dim=8, temporal_hidden=8, embed_dim=8,
                                          decoder_hidden=16, attention_dim=8, max_words=6), **changes})


def captioner(seed: int = 0, **changes):
    """Random weights (seeded), eval mode, batch-norm statistics drawn too."""
    import torch

    from attnserve.export.video.model import VideoShowAttendTell

    torch.manual_seed(seed)
    model = VideoShowAttendTell(config(**changes))
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.normal_(0, 0.2)
            module.running_var.uniform_(0.5, 2.0)
    return model.eval()


def export_repo(model, root: pathlib.Path, limits: dict | None = None) -> pathlib.Path:
    """A model repository holding `model` as NAME version 1; returns the repository."""
    from attnserve.export.video import vocabulary
    from attnserve.export.video.export import export_model

    export_model(model, vocabulary.word_tokenizer(), root / NAME / "1", NAME, limits=limits or LIMITS)
    return root


def frames(count: int, height: int, width: int, seed: int) -> np.ndarray:
    """(count, height, width, 3) uint8: a bright square crossing a smooth random background, so frames
    differ and the motion is there to see (even sizes keep the YUV codecs exact in size)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    base = rng.uniform(40, 200, 3) * (0.6 + 0.4 * np.sin(5 * x + 3 * y + rng.uniform(0, 6)))[..., None]
    out = np.repeat(base[None], count, axis=0)
    side = max(height, width) // 4
    for k in range(count):
        x0 = int((width - side) * k / max(count - 1, 1))
        out[k, height // 3 : height // 3 + side, x0 : x0 + side] = rng.uniform(200, 255, 3)
    return np.clip(out, 0, 255).astype(np.uint8)


@pytest.fixture(scope="session")
def video_model():
    """The tiny captioner; its export is shared by every test module that imports these fixtures."""
    return captioner()


@pytest.fixture(scope="session")
def video_repo(tmp_path_factory, video_model):
    return export_repo(video_model, tmp_path_factory.mktemp("video_repo"))
