"""Writes the captioner's sample scenes for the demo page (clients/web/static/samples/scene-*.png).

Scenes of the held-out generator (another seed than training and the test split), drawn from the emoji the
corpus uses (Noto Color Emoji, fonts-noto-color-emoji), so a lecturer has pictures the bundled captioner
can describe without drawing any. Rerun after the corpus's objects change:

    python -m attnserve.export.image.page_samples
"""

from __future__ import annotations

import json
import pathlib

from attnserve.export.image import objects, scenes
from attnserve.export.image.evaluate import png

OUT = pathlib.Path(__file__).resolve().parents[2] / "clients" / "web" / "static" / "samples"
SEED, COUNT, SIZE = 77, 4, 256


def main() -> None:
    sprites = objects.render_sprites()
    aspect = {name: s.shape[0] / s.shape[1] for name, s in sprites.items()}
    sampler = scenes.SceneSampler(aspect, scenes.held_out_pairs(1))
    listing = []
    for i, scene in enumerate(scenes.generate(sampler, SEED, "test", COUNT)):
        name = f"scene-{i + 1}.png"
        (OUT / name).write_bytes(png(scenes.render(scene, sprites, SIZE)))
        listing.append({"file": name, "drawn": scene.caption})
    (OUT / "scenes.json").write_text(json.dumps(listing, indent=1) + "\n")
    print(f"wrote {len(listing)} scenes to {OUT}")


if __name__ == "__main__":
    main()
