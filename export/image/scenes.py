"""Composed scenes: one to three emoji on a varied background, a caption from the scene graph, every box kept.

A scene is generated from its own seed (the split's seed and its index), so any scene of any split can be
regenerated alone, and a split is the same on every machine. What is drawn is decided in this order:

  kind       "one" (a small or big object), "two" (two of one object), "pair" (two different objects) or
             "group" (two of one object beside a third);
  objects    names from the vocabulary, never a pair the split excludes (the compositional hold-out);
  layout     sizes and positions, rejection-sampled until no boxes overlap and the relation is unambiguous;
  background a solid colour or a linear gradient, with or without pixel noise.

Captions are a function of the image, so that exact match is a fair score: a single object is "a small dog"
or "a big dog" (the sizes never overlap); two different objects name the left one first when they sit side by
side ("a dog to the left of a red apple") and the upper one first when they sit one above the other ("a dog
above a bus"); a group names its two objects first with all four relations ("two cats below a bus"). Side by
side means the centres differ more in x than in y, by a margin no layout comes near.

The compositional split holds out a fixed set of unordered object pairs: training, dev and test scenes never
show them together; its scenes are pairs and groups made only of them.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from attnserve.export.image.objects import OBJECTS

KINDS = ("one", "two", "pair", "group")
# How often each kind is drawn in the random splits.
KIND_WEIGHTS = (0.2, 0.15, 0.35, 0.3)
RELATIONS = ("to the left of", "to the right of", "above", "below")
# Longer side of a sprite as a fraction of the image side, per role.
SIZES = {"small": (0.24, 0.3), "big": (0.44, 0.54), "two": (0.26, 0.38), "pair": (0.26, 0.38), "group": (0.24, 0.32)}
# A relation is horizontal when |dx| >= AXIS_MARGIN * |dy| of the centres (vertical likewise), never in between.
AXIS_MARGIN = 1.5
# Empty space kept between boxes, as a fraction of the image side.
GAP = 0.02
SPLIT_IDS = {"train": 0, "dev": 1, "test": 2, "compositional": 3}


@dataclasses.dataclass(frozen=True)
class Placed:
    name: str
    # x0, y0, x1, y1 as fractions of the image side (x1, y1 exclusive); the sprite's opaque bounding box.
    box: tuple[float, float, float, float]

    @property
    def centre(self) -> tuple[float, float]:
        return (self.box[0] + self.box[2]) / 2, (self.box[1] + self.box[3]) / 2


@dataclasses.dataclass(frozen=True)
class Scene:
    id: str
    kind: str
    caption: str
    objects: tuple[Placed, ...]
    # "to the left of", ...; "" for kinds without one.
    relation: str
    # {"type": "solid" | "gradient", "colors": [[r, g, b], ...], "angle": radians, "noise": std, "seed": int}
    background: dict

    def to_json(self) -> dict:
        row = dataclasses.asdict(self)
        row["objects"] = [{"name": o.name, "box": list(o.box)} for o in self.objects]
        return row

    @classmethod
    def from_json(cls, row: dict) -> Scene:
        objects = tuple(Placed(o["name"], tuple(o["box"])) for o in row["objects"])
        return cls(row["id"], row["kind"], row["caption"], objects, row["relation"], row["background"])


def article(name: str) -> str:
    return "an" if name[0] in "aeiou" else "a"


def caption(kind: str, names: list[str], relation: str = "", size: str = "") -> str:
    """The caption of a scene graph; `names` in caption order (a group's repeated object first)."""
    plural = {o.name: o.plural for o in OBJECTS}
    if kind == "one":
        return f"a {size} {names[0]}"
    if kind == "two":
        return f"two {plural[names[0]]}"
    first = f"two {plural[names[0]]}" if kind == "group" else f"{article(names[0])} {names[0]}"
    return f"{first} {relation} {article(names[1])} {names[1]}"


def held_out_pairs(seed: int, count: int = 40, names=None) -> frozenset[frozenset[str]]:
    """Up to `count` unordered object pairs (drawn greedily), no object in more than two of them, so each
    object is still seen with all but two others."""
    names = names or [o.name for o in OBJECTS]
    rng = np.random.default_rng([seed, 99])
    pairs = [frozenset(p) for p in itertools.combinations(sorted(names), 2)]
    uses, chosen = {n: 0 for n in names}, []
    for i in rng.permutation(len(pairs)):
        a, b = sorted(pairs[i])
        if uses[a] < 2 and uses[b] < 2:
            chosen.append(pairs[i])
            uses[a], uses[b] = uses[a] + 1, uses[b] + 1
        if len(chosen) == count:
            break
    return frozenset(chosen)


class SceneSampler:
    """Draws scene graphs; `aspect` maps each name to its sprite's height / width.

    Args:
        aspect: name -> sprite height / width (the box of an object of a given size depends on it).
        excluded: unordered pairs never shown together (random splits), or the only pairs shown (compositional).
        compositional: draw only pairs and groups of the `excluded` pairs.
    """

    def __init__(self, aspect: dict[str, float], excluded: frozenset[frozenset[str]], compositional: bool = False):
        self.aspect = aspect
        self.names = sorted(aspect)
        self.excluded = excluded
        self.compositional = compositional
        self.pairs = sorted(tuple(sorted(p)) for p in excluded)

    def sample(self, rng: np.random.Generator, scene_id: str) -> Scene:
        kind = rng.choice(["pair", "group"]) if self.compositional else rng.choice(KINDS, p=KIND_WEIGHTS)
        background = sample_background(rng)
        for _ in range(1000):
            scene = self._try(rng, str(kind), scene_id, background)
            if scene is not None:
                return scene
        raise RuntimeError(f"no layout found for a {kind} scene ({scene_id})")

    def _names(self, rng: np.random.Generator) -> tuple[str, str]:
        """Two different names: a held-out pair (compositional) or any pair that is not held out."""
        if self.compositional:
            a, b = self.pairs[rng.integers(len(self.pairs))]
            return (a, b) if rng.random() < 0.5 else (b, a)
        while True:
            a, b = rng.choice(self.names, 2, replace=False)
            if frozenset((a, b)) not in self.excluded:
                return str(a), str(b)

    def _try(self, rng, kind: str, scene_id: str, background: dict) -> Scene | None:
        """One layout attempt; None when boxes overlap or the relation would be ambiguous."""
        if kind == "one":
            name, size = str(rng.choice(self.names)), str(rng.choice(["small", "big"]))
            objects = [self._place(rng, name, SIZES[size])]
            return Scene(scene_id, kind, caption(kind, [name], size=size), tuple(objects), "", background)
        if kind == "two":
            name = str(rng.choice(self.names))
            objects = [self._place(rng, name, SIZES["two"]) for _ in range(2)]
            if _overlap(objects):
                return None
            return Scene(scene_id, kind, caption(kind, [name]), tuple(objects), "", background)
        a, b = self._names(rng)
        if kind == "pair":
            objects = [self._place(rng, a, SIZES["pair"]), self._place(rng, b, SIZES["pair"])]
            relation = _relation(objects[0], objects[1])
            if _overlap(objects) or relation is None:
                return None
            # The left (or upper) object is named first.
            if relation in ("to the right of", "below"):
                objects.reverse()
                relation = {"to the right of": "to the left of", "below": "above"}[relation]
            names = [o.name for o in objects]
            return Scene(scene_id, kind, caption(kind, names, relation), tuple(objects), relation, background)
        objects = [self._place(rng, a, SIZES["group"]) for _ in range(2)] + [self._place(rng, b, SIZES["group"])]
        relations = {_relation(objects[0], objects[2]), _relation(objects[1], objects[2])}
        if _overlap(objects) or len(relations) != 1 or None in relations:
            return None
        relation = relations.pop()
        return Scene(scene_id, kind, caption(kind, [a, b], relation), tuple(objects), relation, background)

    def _place(self, rng, name: str, size_range: tuple[float, float]) -> Placed:
        """A box of the sprite's aspect, its longer side drawn from `size_range`, anywhere inside the image."""
        side = rng.uniform(*size_range)
        aspect = self.aspect[name]
        w, h = (side / aspect, side) if aspect >= 1 else (side, side * aspect)
        x0, y0 = rng.uniform(0, 1 - w), rng.uniform(0, 1 - h)
        return Placed(name, (x0, y0, x0 + w, y0 + h))


def _relation(a: Placed, b: Placed) -> str | None:
    """Where a lies relative to b, or None when neither axis clearly dominates."""
    (ax, ay), (bx, by) = a.centre, b.centre
    dx, dy = ax - bx, ay - by
    if abs(dx) >= AXIS_MARGIN * abs(dy):
        return "to the left of" if dx < 0 else "to the right of"
    if abs(dy) >= AXIS_MARGIN * abs(dx):
        return "above" if dy < 0 else "below"
    return None


def _overlap(objects: list[Placed]) -> bool:
    for a, b in itertools.combinations(objects, 2):
        if (a.box[0] < b.box[2] + GAP and b.box[0] < a.box[2] + GAP
                and a.box[1] < b.box[3] + GAP and b.box[1] < a.box[3] + GAP):
            return True
    return False


def sample_background(rng: np.random.Generator) -> dict:
    """A solid or gradient background, with or without pixel noise (export/video draws its clips on them too)."""
    kind = str(rng.choice(["solid", "gradient"]))
    colors = rng.integers(0, 256, (2 if kind == "gradient" else 1, 3)).tolist()
    noise = float(rng.uniform(4, 30)) if rng.random() < 0.5 else 0.0
    return {"type": kind, "colors": colors, "angle": float(rng.uniform(0, 2 * math.pi)), "noise": noise,
            "seed": int(rng.integers(2**31))}


def render_background(background: dict, size: int) -> np.ndarray:
    """(size, size, 3) float32 in 0..255."""
    colors = np.array(background["colors"], dtype=np.float32)
    if background["type"] == "solid":
        image = np.broadcast_to(colors[0], (size, size, 3)).copy()
    else:
        t = (np.arange(size) + 0.5) / size - 0.5
        along = math.cos(background["angle"]) * t[None, :] + math.sin(background["angle"]) * t[:, None]  # (H, W)
        along = (along - along.min()) / max(float(np.ptp(along)), 1e-6)
        image = colors[0] + along[..., None] * (colors[1] - colors[0])
    if background["noise"] > 0:
        image += np.random.default_rng(background["seed"]).normal(0, background["noise"], image.shape)
    return image.astype(np.float32)


def render(scene: Scene, sprites: dict[str, np.ndarray], size: int) -> np.ndarray:
    """The scene drawn at `size` x `size` pixels: (size, size, 3) uint8."""
    from PIL import Image

    image = render_background(scene.background, size)
    for o in scene.objects:
        x0, y0, x1, y1 = (round(v * size) for v in o.box)
        sprite = Image.fromarray(sprites[o.name]).resize((max(x1 - x0, 1), max(y1 - y0, 1)), Image.Resampling.LANCZOS)
        rgba = np.asarray(sprite).astype(np.float32)
        alpha = rgba[..., 3:] / 255.0
        region = image[y0 : y0 + rgba.shape[0], x0 : x0 + rgba.shape[1]]
        region[:] = region * (1 - alpha) + rgba[..., :3] * alpha
    return np.clip(np.rint(image), 0, 255).astype(np.uint8)


def pixel_box(box: tuple[float, float, float, float], size: int) -> tuple[int, int, int, int]:
    """A fractional box in the pixels `render` draws it at, at `size`."""
    return tuple(round(v * size) for v in box)


def generate(sampler: SceneSampler, seed: int, split: str, count: int) -> list[Scene]:
    """`count` scenes of `split`, scene i drawn from its own generator (seed, split, i)."""
    split_id = SPLIT_IDS[split]
    return [sampler.sample(np.random.default_rng([seed, split_id, i]), f"{split}_{i:06d}") for i in range(count)]
