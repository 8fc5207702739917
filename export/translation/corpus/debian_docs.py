"""Debian Reference and the Debian Administrator's Handbook, English vs zh-TW.

Both are DocBook-generated HTML with one file per chapter in each language.  The
translations keep the document structure, so blocks are paired by position: the
sequences of block signatures (tag + class) are aligned with :mod:`difflib`, and
only runs where both sides have the same structure are used.  Where the
translator split or merged a paragraph the run breaks and nothing is guessed.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Iterator

from . import Pair
from .html_blocks import Block, blocks

REFERENCE = {"en": "debian-reference-en", "zh": "debian-reference-zh-tw"}
REFERENCE_DIR = "usr/share/debian-reference"
HANDBOOK = "debian-handbook"
HANDBOOK_DIR = "usr/share/doc/debian-handbook/html"
# The handbook wraps paragraphs in <div class="para">, which count as blocks.
_EXTRA_BLOCK_CLASSES = frozenset({"para"})
# Navigation and tables of contents repeat chapter titles; they are not prose.
_NAVIGATION_CLASSES = frozenset({"toc", "navfooter", "navheader", "docnav", "docnav top"})


def _page_blocks(page: Path) -> list[Block]:
    html = page.read_text(encoding="utf-8", errors="replace")
    skip = lambda attrs: attrs.get("class") in _NAVIGATION_CLASSES  # noqa: E731
    return blocks(html, skip, _EXTRA_BLOCK_CLASSES)


def aligned(en_blocks: list[Block], zh_blocks: list[Block]) -> Iterator[tuple[str, str]]:
    """Yield (en, zh) texts for blocks inside runs of identical structure."""
    matcher = difflib.SequenceMatcher(
        None, [b.signature for b in en_blocks], [b.signature for b in zh_blocks], autojunk=False
    )
    for tag, i1, i2, j1, _ in matcher.get_opcodes():
        if tag == "equal":
            for offset in range(i2 - i1):
                yield en_blocks[i1 + offset].text, zh_blocks[j1 + offset].text


def _pair_pages(pages: list[tuple[Path, Path]], source: str) -> Iterator[Pair]:
    for en_page, zh_page in pages:
        if zh_page.is_file():
            for en, zh in aligned(_page_blocks(en_page), _page_blocks(zh_page)):
                yield Pair(en, zh, source)


def extract_reference(debs) -> Iterator[Pair]:
    en_dir = debs.root(REFERENCE["en"]) / REFERENCE_DIR
    zh_dir = debs.root(REFERENCE["zh"]) / REFERENCE_DIR
    pages = [(p, zh_dir / p.name.replace(".en.html", ".zh-tw.html"))
             for p in sorted(en_dir.glob("*.en.html"))]
    yield from _pair_pages(pages, "debian_reference")


def extract_handbook(debs) -> Iterator[Pair]:
    html_dir = debs.root(HANDBOOK) / HANDBOOK_DIR
    pages = [(p, html_dir / "zh-TW" / p.name) for p in sorted((html_dir / "en-US").glob("*.html"))]
    yield from _pair_pages(pages, "debian_handbook")
