"""Deterministic train/dev/test assignment keyed on the English source string.

The split depends only on a SHA-1 of the normalised English text, so every
translation of one English string lands in the same split, a rebuild always
gives the same split, and adding a source never moves existing pairs.
"""

from __future__ import annotations

import hashlib
import re

# Parts per 10,000 of the hash space.
DEV_SHARE = 150
TEST_SHARE = 150
SPLITS = ("train", "dev", "test")
_SPACES = re.compile(r"\s+")


def normalise_en(en: str) -> str:
    """Case- and whitespace-insensitive key, so "Open File" and "open file" stay together."""
    return _SPACES.sub(" ", en).strip().lower()


def split_of(en: str) -> str:
    digest = hashlib.sha1(normalise_en(en).encode("utf-8")).digest()
    bucket = int.from_bytes(digest[:4], "big") % 10_000
    if bucket < DEV_SHARE:
        return "dev"
    if bucket < DEV_SHARE + TEST_SHARE:
        return "test"
    return "train"


def order_key(en: str, zh: str) -> bytes:
    """Stable pseudo-random order for the output files (not grouped by source)."""
    return hashlib.sha1(f"{en}\t{zh}".encode("utf-8")).digest()
