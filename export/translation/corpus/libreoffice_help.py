"""LibreOffice help pages: English and zh-TW paragraphs paired by their HTML ``id``.

Every help page exists under ``help/en-US/`` and ``help/zh-TW/`` with the same
relative path, and each paragraph/heading keeps the id (``par_id…``, ``hd_id…``)
of its source string across languages, so pairing needs no alignment heuristics.
Untranslated paragraphs (the zh page keeps the English) are dropped by cleaning.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

from . import Pair
from .html_blocks import blocks

PACKAGES = {"en": "libreoffice-help-en-us", "zh": "libreoffice-help-zh-tw"}
HELP_DIR = "usr/share/libreoffice/help"
_PARAGRAPH_ID = re.compile(r"^(par|hd)_id")
# Platform variants ("LibreOffice - Preferences" on macOS) sit in hidden spans next to
# the default wording; keep only the default so each side reads as one sentence.
_PLATFORM_CLASSES = {"MAC", "WIN", "UNIX", "LINUX"}


def _hide_platform_variants(attrs: dict[str, str]) -> bool:
    return "hidden" in attrs and attrs.get("class", "") in _PLATFORM_CLASSES


def _paragraphs(page: Path) -> dict[str, str]:
    """Map paragraph id -> text; the first occurrence wins when an id repeats."""
    found: dict[str, str] = {}
    html = page.read_text(encoding="utf-8", errors="replace")
    for block in blocks(html, _hide_platform_variants):
        pid = block.attrs.get("id", "")
        if _PARAGRAPH_ID.match(pid):
            found.setdefault(pid, block.text)
    return found


def extract(debs) -> Iterator[Pair]:
    en_root = debs.root(PACKAGES["en"]) / HELP_DIR / "en-US"
    zh_root = debs.root(PACKAGES["zh"]) / HELP_DIR / "zh-TW"
    for en_page in sorted(en_root.rglob("*.html")):
        zh_page = zh_root / en_page.relative_to(en_root)
        if not zh_page.is_file():
            continue
        zh_paragraphs = _paragraphs(zh_page)
        for pid, en in _paragraphs(en_page).items():
            if pid in zh_paragraphs:
                yield Pair(en, zh_paragraphs[pid], "libreoffice_help")
