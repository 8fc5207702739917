"""The bundled clip captioner (models/caption-video): it loads, captions freshly drawn clips sent as MP4 and GIF
files larger than its input, its verbs look at the frames of their action and its nouns at their object.

The clips are drawn from the Noto Color Emoji font (Debian fonts-noto-color-emoji); without it the test is
skipped, as no clip is committed."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

from attnserve.export.image import objects
from attnserve.export.video import clips, scoring
from attnserve.export.video.evaluate import attention_of
from attnserve.export.video.render import FrameRenderer, clip_file
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.registry import load_engines
from attnserve.api.generation import AttentionGranularity, AttentionOptions, GenerationRequest, VideoInput
from attnserve.server.model.runtime import RuntimeOptions

pytest.importorskip("av")
pytestmark = pytest.mark.bundled

ROOT = pathlib.Path(__file__).parents[1]
REPOSITORY = pathlib.Path(os.environ.get("ATTNSERVE_BUNDLED_MODELS", ROOT / "models"))
MODEL = "caption-video"
# Clips of the random test split's generator under another seed: none was seen in training.
SEED, COUNT = 2024, 24
# What the clips must reach. Version 1 measured 24 of 24 exact, temporal pointing 0.83 (chance 0.39, 25 verbs)
# and spatial pointing 0.32 here (chance about 0.05; the 0.8 is not met: see the model card).
EXACT, TEMPORAL, SPATIAL = 0.9, 0.7, 0.2


@pytest.fixture(scope="module")
def renderer():
    if not objects.FONT.exists():
        pytest.skip(f"no emoji to draw clips with: {objects.FONT} (Debian fonts-noto-color-emoji)")
    return FrameRenderer(objects.render_sprites(objects=clips.OBJECT_SET))


@pytest.fixture(scope="module")
def engine():
    if not (REPOSITORY / MODEL).is_dir():
        pytest.skip(f"no bundled model at {REPOSITORY / MODEL}")
    registry = load_engines(REPOSITORY, RuntimeOptions(), BatchingOptions())
    yield registry.get(MODEL)
    registry.close()


def test_the_bundled_captioner_describes_new_clips_and_points_in_time_and_space(engine, renderer):
    aspect = {name: s.shape[0] / s.shape[1] for name, s in renderer.sprites.items()}
    drawn = clips.generate(clips.ClipSampler(aspect, clips.held_out_pairs(1)), SEED, "test", 0, COUNT)
    options = AttentionOptions(enabled=True, granularity=AttentionGranularity.WORDS)
    files = [clip_file(renderer, c, 96, 12, "gif" if i % 4 == 3 else "mp4") for i, c in enumerate(drawn)]
    futures = [engine.submit(GenerationRequest(MODEL, video=VideoInput(f), attention=options)) for f in files]
    results = [f.result(60) for f in futures]
    info = engine.info.video
    exact = np.mean([r.text == c.caption for r, c in zip(results, drawn)])
    temporal = [t for r, c in zip(results, drawn)
                for t in scoring.temporal_trials(r.text.split(), attention_of(r, info.grid_rows * info.grid_cols), c)]
    spatial = [t.hit for r, c in zip(results, drawn)
               for t in scoring.spatial_trials(r.text.split(), attention_of(r, info.grid_rows * info.grid_cols), c,
                                               info.grid_cols)]
    assert exact >= EXACT, [(r.text, c.caption) for r, c in zip(results, drawn) if r.text != c.caption]
    assert np.mean([t.mass for t in temporal]) >= TEMPORAL and len(temporal) >= COUNT
    assert np.mean([t.mass for t in temporal]) > np.mean([t.chance for t in temporal]) + 0.2
    assert np.mean(spatial) >= SPATIAL
