"""The voice catalogue: which voices train, which are held out, and how each is varied.

Voice diversity is the main defence against failing on an unseen voice
(shared/notes/speech-measurements.md), so every training utterance draws its own voice
and engine-native settings: an espeak-ng accent with one of ~70 variants, a random pitch
(``-p`` 0-99), pitch range and rate; a flite or festival voice with a random duration
stretch and, for the diphone voices, a random mean F0. flite and festival voices are all
male; ``augment`` shifts them up in pitch more often to widen that.

Three voices are **held out** and never appear in train, dev or test_seen: Piper's neural
``en_US-joe-medium``, festival ``cmu_us_slt_arctic_hts`` and flite ``slt`` (the last two are
the same CMU ARCTIC speaker, so neither may train). They speak the test sentences with
their default settings, for the unseen-voice score.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Voice:
    """One engine voice."""

    engine: str  # "espeak-ng", "flite", "festival" or "piper"
    name: str  # the engine's name for it, e.g. "en-us+f3", "kal16", "ked_diphone"

    @property
    def key(self) -> str:
        return f"{self.engine}:{self.name}"


# espeak-ng 1.51 English accents (`espeak-ng --voices=en`, mbrola ones excluded: no mbrola).
ESPEAK_ACCENTS = ("en-us", "en", "en-gb-scotland", "en-gb-x-gbclan", "en-gb-x-rp", "en-gb-x-gbcwmd",
                  "en-029", "en-us-nyc")
# espeak-ng variants (voices/!v). Left out: whisper/whisperf (unvoiced), croak, Demonic,
# UniRobot, anikaRobot, robosoft* (robotic effects), fast (overrides the rate).
ESPEAK_VARIANTS = (
    "", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "f1", "f2", "f3", "f4", "f5",
    "Alex", "Alicia", "Andrea", "Andy", "Annie", "AnxiousAndy", "Denis", "Diogo", "Gene", "Gene2",
    "Henrique", "Hugo", "Jacky", "Lee", "Marco", "Mario", "Michael", "Mike", "Mr serious", "Nguyen",
    "RicishayMax", "RicishayMax2", "RicishayMax3", "Storm", "Tweaky", "adam", "anika", "announcer",
    "antonio", "aunty", "belinda", "benjamin", "boris", "caleb", "david", "ed", "edward", "edward2",
    "gustave", "grandma", "grandpa", "iven", "iven2", "iven3", "iven4", "john", "kaukovalta", "klatt",
    "klatt2", "klatt3", "klatt4", "linda", "marcelo", "max", "michel", "miguel", "norbert", "pablo",
    "paul", "pedro", "quincy", "rob", "robert", "sandro", "shelby", "steph", "steph2", "steph3",
    "travis", "victor",
)
FLITE_TRAIN = ("kal", "kal16", "awb", "rms")
FESTIVAL_TRAIN = ("kal_diphone", "ked_diphone")
# Share of training utterances per engine (espeak-ng has by far the most voices).
ENGINE_WEIGHTS = {"espeak-ng": 0.5, "flite": 0.3, "festival": 0.2}

HELDOUT_VOICES = (
    Voice("piper", "en_US-joe-medium"),
    Voice("festival", "cmu_us_slt_arctic_hts"),
    Voice("flite", "slt"),
)
HELDOUT_KEYS = frozenset(v.key for v in HELDOUT_VOICES)
# Flite's clunit voices cannot change their F0; the diphone voices can.
_F0_VOICES = {"kal", "kal16", "kal_diphone", "ked_diphone"}


def espeak_voice(accent: str, variant: str) -> Voice:
    return Voice("espeak-ng", f"{accent}+{variant}" if variant else accent)


def train_voices() -> list[Voice]:
    """Every voice a training, dev or test_seen utterance may use."""
    voices = [espeak_voice(a, v) for a in ESPEAK_ACCENTS for v in ESPEAK_VARIANTS]
    voices += [Voice("flite", v) for v in FLITE_TRAIN]
    voices += [Voice("festival", v) for v in FESTIVAL_TRAIN]
    return voices


def sample_train_voice(rng: random.Random) -> tuple[Voice, dict]:
    """A random seen voice and random engine-native settings for one utterance."""
    engine = rng.choices(list(ENGINE_WEIGHTS), weights=list(ENGINE_WEIGHTS.values()))[0]
    if engine == "espeak-ng":
        voice = espeak_voice(rng.choice(ESPEAK_ACCENTS), rng.choice(ESPEAK_VARIANTS))
        settings = {"rate": rng.randint(130, 220), "pitch": rng.randint(0, 99), "range": rng.randint(10, 99)}
    else:
        names = FLITE_TRAIN if engine == "flite" else FESTIVAL_TRAIN
        voice = Voice(engine, rng.choice(names))
        settings = {"duration_stretch": round(rng.uniform(0.85, 1.2), 3)}
        if voice.name in _F0_VOICES:
            settings["f0_mean"] = rng.randint(75, 180)
    if voice.key in HELDOUT_KEYS:
        raise RuntimeError(f"held-out voice {voice.key} drawn for a seen split")
    return voice, settings
