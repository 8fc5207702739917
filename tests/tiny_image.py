"""A tiny random-weight captioner for the tests: the real Show-Attend-Tell model (export/image/model.py) at a
toy size (16 x 16 pixels, a 4 x 4 grid, 16 LSTM units), exported by the real exporter, and test images."""

from __future__ import annotations

import io
import pathlib

import numpy as np

NAME = "tiny-caption"


def config(**changes):
    from attnserve.export.image.model import ShowAttendTellConfig

    return ShowAttendTellConfig(**{**dict(image_size=16, stem=4, stages=(8,), grid_convs=1, feature_dim=8,
                                          embed_dim=8, decoder_hidden=16, attention_dim=8, max_words=6), **changes})


def captioner(seed: int = 0, **changes):
    """Random weights (seeded), eval mode; batch-norm statistics drawn too, so they are not the identity.
    `changes` alter the toy configuration (e.g. fine_grid=True)."""
    import torch

    from attnserve.export.image.model import ShowAttendTell

    torch.manual_seed(seed)
    model = ShowAttendTell(config(**changes))
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.normal_(0, 0.2)
            module.running_var.uniform_(0.5, 2.0)
    return model.eval()


def export_repo(model, root: pathlib.Path, max_bytes: int = 60_000, max_pixels: int = 100_000) -> pathlib.Path:
    """A model repository holding `model` as NAME version 1; returns the repository."""
    from attnserve.export.image import vocabulary
    from attnserve.export.image.export import export_model

    export_model(model, vocabulary.word_tokenizer(), root / NAME / "1", NAME, max_bytes=max_bytes,
                 max_pixels=max_pixels)
    return root


def pixels(height: int, width: int, seed: int, channels: int = 3) -> np.ndarray:
    """Smooth random colours plus noise: every image different, neighbouring pixels related."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    base = rng.uniform(0, 255, (1, 1, channels)) * (0.5 + 0.5 * np.sin(6 * x + 4 * y + rng.uniform(0, 6)))[..., None]
    return np.clip(base + rng.normal(0, 30, (height, width, channels)), 0, 255).astype(np.uint8).squeeze()


def encode(array: np.ndarray, fmt: str = "PNG", **options) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, fmt, **options)
    return buffer.getvalue()
