"""Normalise raw pair text and decide which pairs are good enough to train on.

``clean_pair``/``clean_text`` strip what is UI machinery rather than language (accelerator
markers, format placeholders, markup, URLs) and tidies whitespace;
``rejection`` says why a cleaned pair should be dropped, or returns ``None``.
"""

from __future__ import annotations

import html
import re
from functools import lru_cache
from pathlib import Path

MAX_CHARS = 300
# Hanzi in the main and extension-A blocks plus compatibility ideographs.
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LATIN = re.compile(r"[A-Za-z]")

# Stop at closing brackets/quotes so "(see http://x)" leaves "(see )", not "(see".
_URL = re.compile(r"(?:(?:https?|ftp)://|www\.|mailto:)[^\s)\]>」）\"']+")
# Only real markup (HTML, Pango, Qt rich text): "<file>" or "<命令>" in a usage string is
# text, and the Chinese side keeps its own translated "<命令>".
_MARKUP_TAGS = (
    "a|b|big|blockquote|body|br|center|cite|code|dd|div|dl|dt|em|font|h[1-6]|head|hr|html|i|img"
    "|kbd|li|nobr|ol|p|pre|qt|s|small|span|strong|style|sub|sup|table|td|th|tr|tt|u|ul|var"
)
_TAG = re.compile(rf"</?\s*(?:{_MARKUP_TAGS})(?:\s[^<>]*)?/?>", re.IGNORECASE)
# "&File" (Qt/KDE) but not an entity such as "&amp;"; "&&" is a literal ampersand.
_AMP_ACCEL = re.compile(r"&(?!&)(?!(?:[A-Za-z]+|#\d+|#x[0-9A-Fa-f]+);)(?=\w)")
# GTK "_File"/"Te_xt" and LibreOffice "~Logo" mark the accelerator inside a word.
_INWORD_ACCEL = re.compile(r"[_~](?=[^\W_])")
# Chinese catalogs append the accelerator key: "檔案(_F)", "檔案(&F)" and, after a
# non-ASCII character only (so "(A)" in English stays), "檔案 (F)".
_ZH_ACCEL = re.compile(r"\s*[(（][_&~][A-Za-z0-9][)）]|(?<=[^\x00-\x7f])\s*[(（][A-Za-z0-9][)）]")
_PLACEHOLDERS = re.compile(
    r"%default\b|%prog\b"  # optparse help texts (calibre)
    r"|~%|~[asdA](?![A-Za-z])"  # Scheme format directives (gnucash reports)
    r"|%\d*\$?[-+#0']*\d*(?:\.\d+)?(?:hh|h|ll|l|L|q|j|z|t|I64|I32)?[diouxXeEfFgGcCsSpn@]"  # printf
    r"|%\([\w.-]+\)[-+#0]*\d*(?:\.\d+)?[a-zA-Z]"  # python %(name)s
    r"|\{[\w.\[\]-]*(?:![rsa])?(?::[^{}]*)?\}"  # str.format / ICU-ish {0}, {name}
    r"|%[1-9]\d?\b"  # Qt / LibreOffice %1
    r"|%[<>]"  # gcc's quoting markers around code
    r"|\$\([A-Z0-9_]+\)|\$[A-Z_]{2,}\$|\$\{[\w-]+\}"  # LibreOffice $(ARG1), $RESOURCE$, ${var}
)
_EMPTY_BRACKETS = re.compile(r"`\s*'|\(\s*\)|\[\s*\]|「\s*」|『\s*』|“\s*”|\"\s*\"|'\s*'|‘\s*’|（\s*）|《\s*》")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([.,:;!?)\]}，。：；！？、）])")
_SPACES = re.compile(r"\s+")
# Invisible characters (BOM, zero-width, soft hyphen, C0/C1 controls) break exact
# deduplication and, in some readers, line splitting.
_INVISIBLE = re.compile(r"[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f\u00ad\u200b-\u200d\u2060\ufeff]")
# A placeholder removed from between two hanzi must not leave a space behind
# ("無法旋轉 %d 邊線"), but spaces the translator typed between hanzi stay.
_HOLE = "\x01"
_HOLE_BETWEEN_CJK = re.compile(rf"(?<=[\u3400-\u9fff\uf900-\ufaff])\s*{_HOLE}\s*(?=[\u3400-\u9fff\uf900-\ufaff])")


def strip_inword_accelerator(text: str, other: str) -> str:
    """Drop a ``_``/``~`` accelerator marker from ``text``, using its translation ``other``.

    An accelerator occurs once per string and the translation never copies the
    marked word (it writes "(_X)" or nothing), whereas an identifier such as
    ``file_name`` is carried over into the translation verbatim.
    """
    marks = _INWORD_ACCEL.findall(text)
    if len(marks) != 1 or text.count(marks[0]) != 1:
        return text
    word = next(w for w in re.findall(r"[\w~.-]+", text) if marks[0] in w)
    if word.strip(".-") in other:
        return text
    return _INWORD_ACCEL.sub("", text, count=1)


def clean_pair(en: str, zh: str) -> tuple[str, str]:
    # Remove "(_X)" before looking for in-word markers, or "(_X)" would become "(X)".
    zh = _ZH_ACCEL.sub("", zh)
    return (clean_text(strip_inword_accelerator(en, zh)),
            clean_text(strip_inword_accelerator(zh, en)))


def clean_text(text: str) -> str:
    """Return ``text`` with accelerators, placeholders, markup and URLs removed."""
    text = _INVISIBLE.sub("", text)
    text = _URL.sub(" ", text)
    text = _TAG.sub(" ", text)
    text = _ZH_ACCEL.sub("", text)
    text = _AMP_ACCEL.sub("", text).replace("&&", "&")
    text = html.unescape(text)
    text = _PLACEHOLDERS.sub(_HOLE, text.replace("%%", "\0")).replace("\0", "%")
    text = _HOLE_BETWEEN_CJK.sub("", text).replace(_HOLE, " ")
    text = _EMPTY_BRACKETS.sub(" ", text)
    text = _SPACES.sub(" ", text)  # also turns tabs and newlines into spaces for the TSV
    text = _SPACE_BEFORE_PUNCT.sub(r"\1", text)
    # Trailing separators are often what is left of a removed placeholder ("Error: %s").
    return text.strip(" -–—:;,|/\\：；，、")


def has_cjk(text: str) -> bool:
    return _CJK.search(text) is not None


@lru_cache(maxsize=1)
def simplified_only_chars() -> frozenset[str]:
    """Hanzi that exist only in Simplified script, from OpenCC's own tables.

    Some zh_TW catalogs (calibre's above all) contain strings copied from zh_CN.
    A character counts as simplified-only when OpenCC maps it to other characters
    and never to itself (so shared characters such as 里/台/游/干 are not flagged)
    and Taiwan conversion changes it (so variants such as 群/床/峰 are not flagged).
    """
    import opencc  # opencc-python-reimplemented, part of the `export` extra

    table = Path(opencc.__file__).parent / "dictionary" / "STCharacters.txt"
    to_taiwan = opencc.OpenCC("s2tw")
    chars = set()
    for line in table.read_text(encoding="utf-8").splitlines():
        char, _, targets = line.partition("\t")
        if len(char) == 1 and char not in targets.split() and to_taiwan.convert(char) != char:
            chars.add(char)
    return frozenset(chars)


def _ratio_ok(en: str, zh: str) -> bool:
    # English runs ~1.5-5 characters per Chinese character for real translations;
    # short UI labels swing widely, so only judge strings with some length.
    if len(en) < 20 and len(zh) < 10:
        return True
    ratio = len(en) / max(len(zh), 1)
    return 0.6 <= ratio <= 9.0


def rejection(en: str, zh: str) -> str | None:
    """Why the cleaned pair (en, zh) should be dropped, or ``None`` to keep it."""
    if not en or not zh:
        return "empty"
    if not has_cjk(zh):
        return "zh_without_cjk"
    if not _LATIN.search(en):
        return "en_without_latin"
    if has_cjk(en):
        return "en_with_cjk"
    if en == zh:
        return "untranslated"
    if not simplified_only_chars().isdisjoint(zh):
        return "zh_simplified"
    if len(en) > MAX_CHARS or len(zh) > MAX_CHARS:
        return "too_long"
    if not _ratio_ok(en, zh):
        return "length_ratio"
    return None
