"""The bundled captioner (models/caption-emoji): it loads, captions freshly drawn scenes as a client sends
them (PNG files larger than its input), and its attention points at the objects it names.

The scenes are drawn from the emoji the corpus builder renders (data/scenes/sprites.npz, or the Noto Color
Emoji font when installed); without either the test is skipped, as no image is committed."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

from attnserve.export.image import objects, scenes, scoring
from attnserve.export.image.evaluate import png
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.api.generation import AttentionGranularity, AttentionOptions, GenerationRequest, ImageInput
from attnserve.server.engine.registry import load_engines
from attnserve.server.model.runtime import RuntimeOptions

pytestmark = pytest.mark.bundled

ROOT = pathlib.Path(__file__).parents[1]
REPOSITORY = pathlib.Path(os.environ.get("ATTNSERVE_BUNDLED_MODELS", ROOT / "models"))
MODEL = "caption-emoji"
SPRITES = ROOT / "data" / "scenes" / "sprites.npz"
# Scenes of the random test split's generator under another seed: none was seen in training.
SEED, COUNT, SIZE = 2024, 24, 256


@pytest.fixture(scope="module")
def sprites():
    if SPRITES.exists():
        return objects.load_sprites(SPRITES)
    if objects.FONT.exists():
        return objects.render_sprites()
    pytest.skip("no emoji to draw scenes with: build the corpus (python -m attnserve.export.image.build)")


@pytest.fixture(scope="module")
def engine():
    if not (REPOSITORY / MODEL).is_dir():
        pytest.skip(f"no bundled model at {REPOSITORY / MODEL}")
    registry = load_engines(REPOSITORY, RuntimeOptions(), BatchingOptions())
    yield registry.get(MODEL)
    registry.close()


def test_the_bundled_captioner_describes_new_scenes_and_points_at_what_it_names(engine, sprites):
    aspect = {name: s.shape[0] / s.shape[1] for name, s in sprites.items()}
    sampler = scenes.SceneSampler(aspect, scenes.held_out_pairs(1))
    graphs = scenes.generate(sampler, SEED, "test", COUNT)
    options = AttentionOptions(enabled=True, granularity=AttentionGranularity.WORDS)
    futures = [engine.submit(GenerationRequest(MODEL, image=ImageInput(png(scenes.render(s, sprites, SIZE))),
                                               attention=options)) for s in graphs]
    results = [f.result(60) for f in futures]
    exact = np.mean([r.text == s.caption for r, s in zip(results, graphs)])
    grid = engine.info.image.grid_rows
    assert engine.info.image.grid_cols == grid
    def pointing(overlap: bool) -> list[bool]:
        return [hit for r, s in zip(results, graphs)
                for hit in scoring.pointing_trials(r.text.split(), np.asarray(r.attention.weights), s, grid, overlap)]

    assert exact >= 0.75, [(r.text, s.caption) for r, s in zip(results, graphs) if r.text != s.caption]
    # Chance is about 0.1 for the cell centre; version 2 measured 0.92 exact, 0.89 (centre) and 0.89 (overlap)
    # here (version 1, on its 8 x 8 grid: 0.79 and 0.94).
    assert np.mean(pointing(False)) >= 0.75 and np.mean(pointing(True)) >= 0.8 and len(pointing(False)) >= COUNT
