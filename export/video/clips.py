"""Animated scenes: one or two emoji that jump, fall, appear, disappear, grow, shrink, move or pass each other
on a still background, with a caption, and where and when every action happens.

A clip is drawn from its own seed (the split's seed and its index), so any clip of any split can be drawn
again alone, on any machine, at any frame rate: an actor's box and opacity are functions of time
(`Actor.at`), so the frames a model is trained on (`sample_times`) and a 25 fps MP4 of the same clip show
the same motion. What is drawn is decided in this order:

  event      one of EVENTS, each with its caption template ("a dog jumps over a soccer ball");
  objects    the doer and, for two-object events, a second object, never a (verb, doer) pair the split
             holds out (the compositional split shows only those);
  timing     the clip's duration (1 to 3 s) and each verb's action window, a stretch of at least two of the
             model's frames; before and after it the actors stand still;
  layout     sizes and positions, rejection-sampled until the scene is unambiguous (a jump clears what it
             jumps over, two objects that do not pass each other never overlap);
  background a solid colour or a gradient, with or without noise (export/image/scenes.py's).

Per-frame ground truth: every actor's box and whether it is visible at any time, and each verb word's action
window, so temporal pointing (does "jumps" look at the frames of the jump?) and spatial pointing (does "dog"
look at the dog?) can be scored from the served attention alone.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from attnserve.export.image.objects import OBJECTS
from attnserve.export.image.scenes import article, sample_background

# The emoji of the image captioner (export/image/objects.py) that stay told apart at 32 x 32 pixels.
NAMES = ("dog", "cat", "pig", "frog", "fish", "bird", "penguin", "octopus", "red apple", "banana", "watermelon",
         "strawberry", "pizza", "carrot", "bus", "rocket", "taxi", "soccer ball", "balloon", "star")
OBJECT_SET = tuple(o for o in OBJECTS if o.name in NAMES)
# Event -> caption template; {x} is the doer, {y} the other object, {direction} "left to right" or back.
EVENTS = {
    "jump": "{x} jumps",
    "fall": "{x} falls",
    "appear": "{x} appears",
    "disappear": "{x} disappears",
    "grow": "{x} grows",
    "shrink": "{x} shrinks",
    "move": "{x} moves from {direction}",
    "jump-over": "{x} jumps over {y}",
    "pass": "{x} passes {y} from {direction}",
    "swap": "{x} appears after {y} leaves",
}
VERBS = ("jumps", "falls", "appears", "disappears", "grows", "shrinks", "moves", "passes", "leaves")
DIRECTIONS = ("left to right", "right to left")
SPLIT_IDS = {"train": 0, "dev": 1, "test": 2, "compositional": 3}
# The model's frames of a clip, and the clips' durations in seconds.
FRAMES = 8
DURATION = (1.0, 3.0)
# An action window covers this share of the clip (swap: each of its two windows).
WINDOW = (0.3, 0.5)
SWAP_WINDOW = (0.22, 0.32)
# Longer side of a sprite as a fraction of the frame side.
SIZE = (0.34, 0.44)
SMALL, BIG = (0.22, 0.28), (0.5, 0.58)
# Two objects that share the frame while one crosses it are drawn smaller.
PAIR = (0.26, 0.32)
GAP = 0.03


@dataclasses.dataclass(frozen=True)
class Actor:
    """One object's motion: still at `start` until the window opens, at `end` once it closes."""

    name: str
    # x0, y0, x1, y1 as fractions of the frame side, before and after the window (x1, y1 exclusive).
    start: tuple[float, float, float, float]
    end: tuple[float, float, float, float]
    # Opacity before and after (0 = not there yet / gone).
    alpha: tuple[float, float]
    # Seconds: the stretch in which it changes.
    window: tuple[float, float]
    # "line" (constant speed), "fall" (accelerating), "arc" (a jump: `height` of the side up at mid-window).
    path: str = "line"
    height: float = 0.0

    def at(self, t: float) -> tuple[tuple[float, float, float, float], float]:
        """(box, opacity) at time t."""
        w0, w1 = self.window
        u = min(max((t - w0) / (w1 - w0), 0.0), 1.0)
        s = u * u if self.path == "fall" else u
        box = [a + s * (b - a) for a, b in zip(self.start, self.end)]
        if self.path == "arc":
            lift = self.height * math.sin(math.pi * u)
            box[1], box[3] = box[1] - lift, box[3] - lift
        return tuple(box), self.alpha[0] + u * (self.alpha[1] - self.alpha[0])


@dataclasses.dataclass(frozen=True)
class Clip:
    id: str
    event: str
    caption: str
    # Seconds.
    duration: float
    actors: tuple[Actor, ...]
    # (verb word, doer, window in seconds) in caption order.
    verbs: tuple[tuple[str, str, tuple[float, float]], ...]
    background: dict

    def boxes(self, t: float) -> list[tuple[str, tuple[float, float, float, float]]]:
        """(name, box) of every actor visible (opacity >= 0.5) at time t."""
        out = []
        for actor in self.actors:
            box, alpha = actor.at(t)
            if alpha >= 0.5:
                out.append((actor.name, box))
        return out

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, row: dict) -> Clip:
        actors = tuple(Actor(a["name"], tuple(a["start"]), tuple(a["end"]), tuple(a["alpha"]), tuple(a["window"]),
                             a["path"], a["height"]) for a in row["actors"])
        verbs = tuple((v, d, tuple(w)) for v, d, w in row["verbs"])
        return cls(row["id"], row["event"], row["caption"], row["duration"], actors, verbs, row["background"])


def sample_times(duration: float, frames: int = FRAMES) -> np.ndarray:
    """The times the model's frames show: the middle of each of `frames` equal stretches of the clip
    (the server samples a decoded video the same way, server/inputs/video.py)."""
    return (np.arange(frames) + 0.5) * duration / frames


def action_frames(window: tuple[float, float], times: np.ndarray) -> np.ndarray:
    """(frames,) bool: the frames whose time lies inside the window."""
    return (times >= window[0]) & (times <= window[1])


def held_out_pairs(seed: int, per_verb: int = 2, names=NAMES) -> frozenset[tuple[str, str]]:
    """(verb, doer) pairs no training clip shows: `per_verb` objects per verb, no object held out twice."""
    rng = np.random.default_rng([seed, 98])
    order = [str(n) for n in rng.permutation(sorted(names))]
    cycle = itertools.cycle(order)
    return frozenset((verb, next(cycle)) for verb in VERBS for _ in range(per_verb))


class ClipSampler:
    """Draws clips; `aspect` maps each name to its sprite's height / width.

    Args:
        aspect: name -> sprite height / width.
        held_out: (verb, doer) pairs; never drawn (random splits), or one of them in every clip (compositional).
        compositional: draw only clips with a held-out pair.
    """

    def __init__(self, aspect: dict[str, float], held_out: frozenset[tuple[str, str]], compositional: bool = False):
        self.aspect = aspect
        self.names = sorted(aspect)
        self.held_out = held_out
        self.compositional = compositional

    def sample(self, rng: np.random.Generator, clip_id: str) -> Clip:
        background = sample_background(rng)
        for _ in range(1000):
            event = str(rng.choice(list(EVENTS)))
            clip = self._try(rng, event, clip_id, background)
            if clip is not None and self._allowed(clip):
                return clip
        raise RuntimeError(f"no clip found for {clip_id}")

    def _allowed(self, clip: Clip) -> bool:
        pairs = {(verb, doer) for verb, doer, _ in clip.verbs}
        held = bool(pairs & self.held_out)
        return held if self.compositional else not held

    def _try(self, rng, event: str, clip_id: str, background: dict) -> Clip | None:
        duration = float(rng.uniform(*DURATION))
        x, y = (str(n) for n in rng.choice(self.names, 2, replace=False))
        direction = str(rng.choice(DIRECTIONS))
        if event == "swap":
            first = _window(rng, duration, SWAP_WINDOW, (0.05, 0.5))
            second = _window(rng, duration, SWAP_WINDOW, (0.5, 0.95))
            if first is None or second is None:
                return None
            actors = self._swap(rng, x, y, first, second)
            verbs = (("appears", x, second), ("leaves", y, first))
        else:
            window = _window(rng, duration, WINDOW, (0.05, 0.95))
            if window is None:
                return None
            actors = getattr(self, "_" + event.replace("-", "_"))(rng, x, y, window, direction)
            verb = EVENTS[event].split()[1]
            verbs = ((verb, x, window),)
        if actors is None:
            return None
        words = {"x": f"{article(x)} {x}", "y": f"{article(y)} {y}", "direction": direction}
        caption = f"{EVENTS[event].format(**words)}"
        return Clip(clip_id, event, caption, duration, tuple(actors), verbs, background)

    # ---- one method per event: the actors, or None when the layout is ambiguous --------------------------

    def _box(self, rng, name: str, size=SIZE, x: float | None = None, y: float | None = None):
        side = rng.uniform(*size)
        aspect = self.aspect[name]
        w, h = (side / aspect, side) if aspect >= 1 else (side, side * aspect)
        x0 = rng.uniform(0, 1 - w) if x is None else min(max(x, 0.0), 1 - w)
        y0 = rng.uniform(0, 1 - h) if y is None else min(max(y, 0.0), 1 - h)
        return (x0, y0, x0 + w, y0 + h)

    def _jump(self, rng, x, y, window, direction):
        box = self._box(rng, x, y=1.0)  # standing on the bottom edge
        height = rng.uniform(0.3, 0.45)
        return [Actor(x, box, box, (1.0, 1.0), window, "arc", min(height, box[1] + 0.0))] if box[1] > 0.25 else None

    def _fall(self, rng, x, y, window, direction):
        top = self._box(rng, x, y=rng.uniform(0, 0.05))
        bottom = _moved(top, 0, 1 - top[3] - rng.uniform(0, 0.04))
        return [Actor(x, top, bottom, (1.0, 1.0), window, "fall")] if bottom[1] - top[1] > 0.3 else None

    def _appear(self, rng, x, y, window, direction):
        box = self._box(rng, x)
        return [Actor(x, box, box, (0.0, 1.0), window)]

    def _disappear(self, rng, x, y, window, direction):
        box = self._box(rng, x)
        return [Actor(x, box, box, (1.0, 0.0), window)]

    def _grow(self, rng, x, y, window, direction, grow: bool = True):
        big = self._box(rng, x, BIG)
        cx, cy = (big[0] + big[2]) / 2, (big[1] + big[3]) / 2
        scale = rng.uniform(*SMALL) / max(big[2] - big[0], big[3] - big[1])
        small = tuple(c + scale * (v - c) for v, c in zip(big, (cx, cy, cx, cy)))
        start, end = (small, big) if grow else (big, small)
        return [Actor(x, start, end, (1.0, 1.0), window)]

    def _shrink(self, rng, x, y, window, direction):
        return self._grow(rng, x, y, window, direction, grow=False)

    def _move(self, rng, x, y, window, direction, size=SIZE):
        left = self._box(rng, x, size, x=rng.uniform(0, 0.04))
        right = _moved(left, 1 - left[2] - rng.uniform(0, 0.04), 0)
        start, end = (left, right) if direction == "left to right" else (right, left)
        return [Actor(x, start, end, (1.0, 1.0), window)]

    def _jump_over(self, rng, x, y, window, direction):
        """x hops from one side of y to the other, clearing it; y stands on the bottom edge in the middle."""
        under = self._box(rng, y, PAIR, y=1.0)
        under = _moved(under, 0.5 - (under[0] + under[2]) / 2, 0)
        side = self._box(rng, x, PAIR, y=1.0, x=0.0)
        width = side[2] - side[0]
        left = _moved(side, rng.uniform(0, max(under[0] - width - GAP, 0)), 0)
        right = _moved(left, 1 - left[2] - left[0], 0)
        if left[2] + GAP > under[0] or right[0] < under[2] + GAP:
            return None
        # The jump's top clears y by a margin: x's bottom, lifted, is above y's top.
        height = (left[3] - under[1]) + rng.uniform(0.05, 0.12)
        if left[1] - height < -0.02:
            return None
        start, end = (left, right) if direction == "left to right" else (right, left)
        return [Actor(y, under, under, (1.0, 1.0), window), Actor(x, start, end, (1.0, 1.0), window, "arc", height)]

    def _pass(self, rng, x, y, window, direction):
        """x crosses the frame in front of y, which stands in the middle."""
        still = self._box(rng, y, PAIR)
        still = _moved(still, 0.5 - (still[0] + still[2]) / 2, 0)
        mover = self._move(rng, x, y, window, direction, PAIR)[0]
        lane = (still[1] + still[3]) / 2 + rng.uniform(-0.15, 0.15) - (mover.start[1] + mover.start[3]) / 2
        mover = dataclasses.replace(mover, start=_moved(mover.start, 0, lane), end=_moved(mover.end, 0, lane))
        if min(mover.start[1], mover.start[3]) < -0.01 or max(mover.start[1], mover.start[3]) > 1.01:
            return None
        if _overlap(mover.start, still, 0.0) or _overlap(mover.end, still, 0.0):
            return None
        return [Actor(y, still, still, (1.0, 1.0), window), mover]

    def _swap(self, rng, x, y, first, second):
        gone, new = self._box(rng, y, PAIR), self._box(rng, x, PAIR)
        if _overlap(gone, new):
            return None
        return [Actor(y, gone, gone, (1.0, 0.0), first), Actor(x, new, new, (0.0, 1.0), second)]


def _window(rng, duration: float, share: tuple[float, float], within: tuple[float, float]):
    """An action window of `share` of the clip inside `within` (fractions of it) covering >= 2 model frames."""
    length = rng.uniform(*share) * duration
    lo, hi = within[0] * duration, within[1] * duration - length
    if hi <= lo:
        return None
    start = float(rng.uniform(lo, hi))
    window = (start, start + length)
    return window if action_frames(window, sample_times(duration)).sum() >= 2 else None


def _moved(box, dx: float, dy: float):
    return (box[0] + dx, box[1] + dy, box[2] + dx, box[3] + dy)


def _overlap(a, b, gap: float = GAP) -> bool:
    return a[0] < b[2] + gap and b[0] < a[2] + gap and a[1] < b[3] + gap and b[1] < a[3] + gap


def generate(sampler: ClipSampler, seed: int, split: str, start: int, count: int) -> list[Clip]:
    """Clips start .. start + count - 1 of `split`, clip i drawn from its own generator (seed, split, i)."""
    split_id = SPLIT_IDS[split]
    return [sampler.sample(np.random.default_rng([seed, split_id, i]), f"{split}_{i:07d}")
            for i in range(start, start + count)]
