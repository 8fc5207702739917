"""Builds the scene corpus: sprites, then each split's images and scene graphs, deterministic by seed.

    python -m attnserve.export.image.build --out data/scenes --seed 1

Writes `sprites.npz` (the emoji, cropped, RGBA), and per split `<split>.npz` (`images`: (N, S, S, 3) uint8 at
the model's input size) and `<split>.jsonl` (one scene graph per line: id, kind, caption, relation, objects
with their boxes as fractions of the side, background), plus `corpus.json` (seed, sizes, held-out pairs).

A share of the training scenes is drawn larger (`--large-share`, at 128 to 256 pixels) and brought to the
input size by the server's own resize (server/inputs/image.py), so the model also learns the pixels it is served
when a client sends a large image.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np

from attnserve.export.image import objects, scenes

SPLITS = {"train": 50000, "dev": 1000, "test": 2000, "compositional": 2000}
LARGE_SIZES = (128, 192, 256)


def draw(scene: scenes.Scene, sprites: dict, size: int, render_size: int) -> np.ndarray:
    """The scene at `size` pixels, drawn at `render_size` and resized as the server resizes."""
    if render_size == size:
        return scenes.render(scene, sprites, size)
    from PIL import Image

    from attnserve.server.inputs.image import resize

    return resize(Image.fromarray(scenes.render(scene, sprites, render_size)), size, size)


def build_split(sampler, sprites, seed: int, split: str, count: int, size: int, large_share: float):
    """(images (N, size, size, 3) uint8, scenes)."""
    graphs = scenes.generate(sampler, seed, split, count)
    rng = np.random.default_rng([seed, scenes.SPLIT_IDS[split], 7])
    images = np.empty((count, size, size, 3), dtype=np.uint8)
    for i, scene in enumerate(graphs):
        large = split == "train" and rng.random() < large_share
        images[i] = draw(scene, sprites, size, int(rng.choice(LARGE_SIZES)) if large else size)
    return images, graphs


def build(out: pathlib.Path, seed: int, size: int, splits: dict[str, int], sprites: dict,
          large_share: float = 0.2, held_out: int = 40) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    objects.save_sprites(out / "sprites.npz", sprites)
    aspect = {name: s.shape[0] / s.shape[1] for name, s in sprites.items()}
    excluded = scenes.held_out_pairs(seed, held_out, sorted(sprites))
    for split, count in splits.items():
        sampler = scenes.SceneSampler(aspect, excluded, compositional=split == "compositional")
        images, graphs = build_split(sampler, sprites, seed, split, count, size, large_share)
        np.savez(out / f"{split}.npz", images=images)
        with open(out / f"{split}.jsonl", "w") as f:
            for scene in graphs:
                f.write(json.dumps(scene.to_json()) + "\n")
    info = {"seed": seed, "size": size, "splits": splits, "large_share": large_share,
            "objects": sorted(sprites), "held_out_pairs": sorted(sorted(p) for p in excluded)}
    (out / "corpus.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def load_split(corpus: pathlib.Path, split: str) -> tuple[np.ndarray, list[scenes.Scene]]:
    """(images (N, S, S, 3) uint8, scene graphs) of a built split."""
    with np.load(corpus / f"{split}.npz") as data:
        images = data["images"]
    with open(corpus / f"{split}.jsonl") as f:
        graphs = [scenes.Scene.from_json(json.loads(line)) for line in f]
    return images, graphs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("data/scenes"))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--size", type=int, default=64, help="the model's input side, in pixels")
    parser.add_argument("--font", type=pathlib.Path, default=objects.FONT)
    parser.add_argument("--cldr", type=pathlib.Path, default=objects.CLDR_ANNOTATIONS,
                        help="CLDR annotations/en.xml: the names are checked against it")
    for split, count in SPLITS.items():
        parser.add_argument(f"--{split}", type=int, default=count, help=f"scenes (default {count})")
    args = parser.parse_args()
    objects.check_names(args.cldr)
    sprites = objects.render_sprites(args.font)
    info = build(args.out, args.seed, args.size, {s: getattr(args, s) for s in SPLITS}, sprites)
    print(json.dumps({k: v for k, v in info.items() if k != "held_out_pairs"}))


if __name__ == "__main__":
    main()
