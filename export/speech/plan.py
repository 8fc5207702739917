"""The deterministic build plan: which sentence is spoken by which voice, how perturbed.

Splits (sentences follow the translation corpus's own split, so no test sentence is
ever trained on):

====================  ===================  ==================  ===================
split                 sentences            voices              augmentation
====================  ===================  ==================  ===================
train                 corpus train         seen, random        random (``augment``)
dev                   corpus dev           seen, random        none
test_seen             corpus test          seen, random        none
test_heldout_voices   corpus test          each held-out voice none
====================  ===================  ==================  ===================

test_seen and test_heldout_voices speak the same sentences, so their difference is the
voice alone. Training takes every everyday (HSK) sentence ``everyday_repeats`` times and
the software sentences once, shuffled together, then keeps a prefix whose *estimated*
length reaches the requested hours; when the sentences run out it starts a new pass
with new voices. Every utterance draws from its own ``random.Random(f"{seed}/{id}")``, so
a plan depends only on the seed, the sentences and the options.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from . import augment, voices
from .text import Sentence
from .voices import HELDOUT_KEYS, Voice

SPLITS = ("train", "dev", "test_seen", "test_heldout_voices")
# Characters per second at each engine's neutral settings, and the silence it puts around an
# utterance (medians of a small build); only used to size the training split.
_CHARS_PER_SECOND = {"espeak-ng": 18.8, "flite": 17.6, "festival": 16.7, "piper": 18.9}
_EDGE_SECONDS = {"espeak-ng": 0.05, "flite": 0.35, "festival": 0.4, "piper": 0.2}


@dataclass(frozen=True)
class PlanOptions:
    """What to build; see docs/speech-corpus.md."""

    hours: float = 8.0  # estimated hours of training audio
    seed: int = 0  # everything random derives from it
    everyday_repeats: int = 2  # times each everyday (HSK) training sentence is spoken
    dev_voices: int = 1  # seen voices per dev sentence
    test_voices: int = 1  # seen voices per test_seen sentence
    heldout_voices: tuple[Voice, ...] = voices.HELDOUT_VOICES  # each speaks every test sentence

    def __post_init__(self):
        if self.hours <= 0 or self.everyday_repeats < 0 or min(self.dev_voices, self.test_voices) < 0:
            raise ValueError("hours must be > 0 and repeat counts >= 0")
        unknown = {v.key for v in self.heldout_voices} - HELDOUT_KEYS
        if unknown:
            raise ValueError(f"not held-out voices: {sorted(unknown)}")


@dataclass(frozen=True)
class Utterance:
    """One planned utterance."""

    id: str  # "<split>_<6 digits>", unique in the corpus
    split: str
    sentence: Sentence
    voice: Voice
    settings: dict = field(hash=False)  # engine-native settings (rate, pitch, ...)
    augmentation: augment.Augmentation = augment.NONE
    seed: int = 0  # seeds this utterance's noise

    @property
    def path(self) -> str:
        return f"{self.split}/{self.id}.wav"

    def estimated_seconds(self) -> float:
        s = self.settings
        speed = s.get("rate", 175) / 175 / s.get("duration_stretch", 1.0)
        speed *= self.augmentation.speed * self.augmentation.tempo
        pad = self.augmentation.pad_start + self.augmentation.pad_end
        engine = self.voice.engine
        return len(self.sentence.spoken) / (_CHARS_PER_SECOND[engine] * speed) + _EDGE_SECONDS[engine] + pad


def _utterance(split: str, index: int, sentence: Sentence, options: PlanOptions,
               voice: Voice | None = None) -> Utterance:
    uid = f"{split}_{index:06d}"
    rng = random.Random(f"{options.seed}/{uid}")
    if voice is None:
        voice, settings = voices.sample_train_voice(rng)
    else:
        settings = {}
    aug = augment.NONE
    if split == "train":
        aug = augment.sample(rng, male_only_voice=voice.engine in ("flite", "festival"))
    return Utterance(uid, split, sentence, voice, settings, aug, seed=rng.getrandbits(63))


def _train(sentences: list[Sentence], options: PlanOptions) -> list[Utterance]:
    pool = [s for s in sentences for _ in range(options.everyday_repeats if s.everyday else 1)]
    if not pool:
        return []
    out: list[Utterance] = []
    seconds, limit, npass = 0.0, options.hours * 3600, 0
    while seconds < limit:
        order = list(pool)
        random.Random(f"{options.seed}/train/pass{npass}").shuffle(order)
        for sentence in order:
            u = _utterance("train", len(out), sentence, options)
            out.append(u)
            seconds += u.estimated_seconds()
            if seconds >= limit:
                break
        npass += 1
    return out


def make_plan(sentences: list[Sentence], options: PlanOptions) -> list[Utterance]:
    """Every utterance of the corpus, in manifest order (split by split).

    Raises:
        RuntimeError: if a held-out voice ended up in a seen split (a broken invariant).
    """
    by_split = {name: [s for s in sentences if s.split == name] for name in ("train", "dev", "test")}
    plan = _train(by_split["train"], options)
    for split, source, repeats in (("dev", "dev", options.dev_voices), ("test_seen", "test", options.test_voices)):
        for r in range(repeats):
            for i, s in enumerate(by_split[source]):
                plan.append(_utterance(split, r * len(by_split[source]) + i, s, options))
    for v, voice in enumerate(options.heldout_voices):
        for i, s in enumerate(by_split["test"]):
            plan.append(_utterance("test_heldout_voices", v * len(by_split["test"]) + i, s, options, voice))
    check_heldout(plan)
    return plan


def check_heldout(plan: list[Utterance]) -> None:
    """Raise RuntimeError if a held-out voice speaks outside test_heldout_voices, or a seen one inside."""
    for u in plan:
        heldout = u.voice.key in HELDOUT_KEYS
        if heldout != (u.split == "test_heldout_voices"):
            raise RuntimeError(f"{u.id}: voice {u.voice.key} in split {u.split}")
