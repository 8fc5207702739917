"""Which corpus sentences are read aloud, and the transcript the speller learns.

Two strings exist per utterance:

* the **spoken text** is what a synthesizer reads: the corpus English with its case and
  punctuation, so engines phrase it naturally (pauses at commas, question intonation);
* the **transcript** is the normalised label: lower case, only ``a-z``, the apostrophe
  and single spaces (``ALPHABET``), one word per spoken word.

Every sentence whose reading is ambiguous is dropped rather than guessed at: digits and
symbols (engines disagree on "1.6.5", "%", "&"), acronyms and CamelCase (read letter by
letter or split: "PDF", "LibreOffice"), abbreviations ("Mr.", "e.g."), non-English
letters, markup and placeholders. What remains is read the same way by every engine,
so its transcript is exact.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

# The characters the speller outputs (besides its special tokens).
ALPHABET = "abcdefghijklmnopqrstuvwxyz' "

# Limits of what is read aloud. 180 characters is ~13 s at espeak's default 175 wpm;
# the synthesized audio is checked against MAX_SECONDS again after synthesis.
MIN_WORDS_EVERYDAY = 3
MIN_WORDS_SOFTWARE = 4
MAX_WORDS = 30
MAX_CHARS = 180

# Punctuation that engines read as a pause or intonation, never as a word.
_PROSODY = ".,;:?!\"()'-"
# Typographic marks rewritten to ASCII before anything else, so engines' character
# offsets and ours agree.
_TYPOGRAPHY = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"',
                             "\u2013": ",", "\u2014": ","})
_ALLOWED = re.compile(r"^[A-Za-z\s" + re.escape(_PROSODY) + r"]+$")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr st jr sr etc vs ie eg approx no fig vol ca cf inc ltd co dept min max esp".split())
_ABBREVIATION = re.compile(r"\b([A-Za-z]{1,6})\.(?=\s|$|[A-Za-z]\.)")
_DOTTED_LETTERS = re.compile(r"\b[A-Za-z]\.[A-Za-z]\.")  # e.g., i.e., U.S.
_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*")
_ACRONYM = re.compile(r"[A-Z]{2,}")  # "PDF", "PCs", "URLs"
_INNER_CAPITAL = re.compile(r"[a-z][A-Z]")
_SENTENCE_END = re.compile(r"[.?!][\"')\u2019\u201d]*$")
_REPEATED_PUNCT = re.compile(r"\.\.|--|\?\?|!!|\s[.,;:?!]")
GLUED_PARENTHESIS = re.compile(r"[A-Za-z]\(")  # "file(s)": read as "file s" or "files"
_MENU_PATH = re.compile(r"[A-Za-z] - [A-Z]")  # "Format - Cells - Numbers"


@dataclass(frozen=True)
class Sentence:
    """One sentence chosen for reading aloud."""

    spoken: str  # what the synthesizer reads (case and punctuation kept)
    transcript: str  # the normalised label: ALPHABET only, one word per spoken word
    source: str  # corpus origin, e.g. "hsk/level3", "libreoffice_help"
    split: str  # corpus split the sentence comes from: train, dev or test

    @property
    def words(self) -> list[str]:
        return self.transcript.split()

    @property
    def everyday(self) -> bool:
        return self.source.split("/", 1)[0] == "hsk"


def spoken_form(en: str) -> str:
    """``en`` as given to the engines: typography made ASCII, whitespace collapsed."""
    text = unicodedata.normalize("NFC", en).translate(_TYPOGRAPHY)
    return " ".join(text.replace(" ,", ",").split())


def spoken_words(spoken: str) -> list[tuple[int, str]]:
    """Each transcript word of ``spoken`` as (character offset, spelling as written)."""
    return [(m.start(), m.group()) for m in _WORD.finditer(spoken)]


def normalise(spoken: str) -> str:
    """The transcript of ``spoken``: lower case, letters, in-word apostrophes, single spaces.

    Hyphens and dashes separate words ("well-known" -> "well known"), as engines read them;
    quotes and other punctuation vanish; curly apostrophes become ``'``.

    Raises:
        ValueError: if a character outside letters and prosodic punctuation is present
            (digits, symbols, non-English letters): such text has no unique transcript.
    """
    text = spoken_form(spoken)
    if not _ALLOWED.match(text):
        bad = sorted({c for c in text if not (c.isspace() or c in _PROSODY or ("a" <= c.lower() <= "z"))})
        raise ValueError(f"no transcript for characters {''.join(bad)!r} in {spoken!r}")
    return " ".join(w.lower() for w in _WORD.findall(text))


def rejection(spoken: str, source: str) -> str | None:
    """Why ``spoken`` is not read aloud (a short reason), or None if it is kept."""
    everyday = source.split("/", 1)[0] == "hsk"
    text = spoken_form(spoken)
    if not text:
        return "empty"
    if len(text) > MAX_CHARS:
        return "too_long"
    if not _ALLOWED.match(text):
        return "symbols_digits_or_non_english"
    if _DOTTED_LETTERS.search(text) or any(
            m.group(1).lower() in _ABBREVIATIONS for m in _ABBREVIATION.finditer(text)):
        return "abbreviation"
    if _ACRONYM.search(text) or _INNER_CAPITAL.search(text):
        return "acronym_or_camelcase"
    if _REPEATED_PUNCT.search(text) or GLUED_PARENTHESIS.search(text):
        return "odd_punctuation"
    if _MENU_PATH.search(text):
        return "menu_path"
    words = normalise(text).split()
    if len(words) > MAX_WORDS:
        return "too_long"
    if len(words) < (MIN_WORDS_EVERYDAY if everyday else MIN_WORDS_SOFTWARE):
        return "too_short"
    # Software strings must look like sentences, not labels or menu entries.
    if not everyday and not (text[0].isupper() and _SENTENCE_END.search(text)):
        return "not_a_sentence"
    return None


def select(rows: list[tuple[str, str, str]]) -> tuple[list[Sentence], dict[str, int]]:
    """Keep the readable rows of ``(en, source, split)``, one per transcript.

    The first row of a transcript wins, so the caller's order decides which source and
    split a repeated sentence is credited to (the corpus already keeps each English
    string in one split).

    Returns:
        The kept sentences in input order, and a count of rows per rejection reason
        (``"duplicate"`` included).
    """
    kept: list[Sentence] = []
    reasons: dict[str, int] = {}
    seen: set[str] = set()
    for en, source, split in rows:
        reason = rejection(en, source)
        transcript = normalise(en) if reason is None else ""
        if reason is None and transcript in seen:
            reason = "duplicate"
        if reason is not None:
            reasons[reason] = reasons.get(reason, 0) + 1
            continue
        seen.add(transcript)
        kept.append(Sentence(spoken=spoken_form(en), transcript=transcript, source=source, split=split))
    return kept, reasons
