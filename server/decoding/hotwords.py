"""Hotwords: words a request expects to hear (names, terms of a lecture) made easier for the search to write.

Contextual biasing of each step's distribution by a word list. Before the strategy normalises a row's
logits, every candidate token gains boost x the hotword letters it would leave written:

- a token that continues one of the hotwords gains boost x the letters of that hotword written once it is
  added (the third letter of "ungawa" gains 3 x boost): the further into a hotword, the stronger the pull
  to finish it, so a half-heard name is completed rather than dropped;
- the word break (a marker piece, or the end) after a whole hotword gains boost x its length, so the word
  ends there rather than running on into another;
- every other token gains nothing.

After normalisation this is a reweighting of the model's distribution, so a result's log-probabilities,
scores and word confidences are those of the biased search, as for the other output rules. Measured on
speech-en 12 (models/speech-en/README.md, "Hotwords"): a boost that is too high writes hotwords where none
were said (the pull compounds letter by letter), hence the low default.

Words are matched by their letters, the pieces' word markers dropped: a piece that starts with a marker
("▁" in SentencePiece vocabularies, "Ġ" in byte-level BPE such as Whisper's) begins a new word. Byte-level
pieces spell bytes, so a hotword is matched in its bytes' spelling (GPT-2's printable byte alphabet):
"café" is looked for as "cafÃ©" (and its letters counted as bytes). A phrase's words are boosted one by
one.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np

from attnserve.server.model.tokenization import BYTE_LEVEL_SPACE, METASPACE, Tokenizer

# Request limits: the list is small by design (a talk's names and terms), and every step walks it.
MAX_HOTWORDS = 100
MAX_HOTWORD_CHARS = 50
MAX_BOOST = 10.0


def _byte_alphabet() -> tuple[str, ...]:
    """The character byte-level BPE writes for each byte: printable Latin-1 bytes stand for themselves, the
    others (controls, space, ...) take the characters from U+0100 on, in byte order."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    others = iter(range(0x100, 0x200))
    return tuple(chr(b) if b in printable else chr(next(others)) for b in range(256))


BYTE_ALPHABET = _byte_alphabet()


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """A model's output pieces as hotword matching reads them (one per engine, shared by its requests).

    Args:
        pieces: the piece of every id.
        special: the ids that are not text (EOS among them): they end the current word.
        marker: what a piece that begins a word starts with: METASPACE, or BYTE_LEVEL_SPACE (whose pieces
            spell bytes).
    """

    pieces: tuple[str, ...]
    special: frozenset[int]
    marker: str = METASPACE

    def spell(self, word: str) -> str:
        """`word` as the pieces write it: itself, or for byte-level pieces its UTF-8 bytes' characters."""
        if self.marker == BYTE_LEVEL_SPACE:
            return "".join(BYTE_ALPHABET[b] for b in word.encode("utf-8"))
        return word

    @functools.cached_property
    def starts_word(self) -> np.ndarray:
        """(V,) whether a token begins a new word (a marker piece) or ends the text (a special token)."""
        return np.array([i in self.special or p.startswith(self.marker) for i, p in enumerate(self.pieces)])

    @functools.cached_property
    def continuations(self) -> dict[str, np.ndarray]:
        """Letters -> the ids of the pieces that add exactly them to the current word."""
        out: dict[str, list[int]] = {}
        for i, piece in enumerate(self.pieces):
            if i not in self.special and not piece.startswith(self.marker) and piece:
                out.setdefault(piece, []).append(i)
        return {k: np.array(v, dtype=np.int64) for k, v in out.items()}

    @functools.cached_property
    def openings(self) -> dict[str, np.ndarray]:
        """Letters after the marker -> the ids of the marker pieces that open a word with them."""
        out: dict[str, list[int]] = {}
        for i, piece in enumerate(self.pieces):
            if i not in self.special and piece.startswith(self.marker):
                out.setdefault(piece.lstrip(self.marker), []).append(i)
        return {k: np.array(v, dtype=np.int64) for k, v in out.items()}

    @functools.cached_property
    def letters(self) -> frozenset[str]:
        """Every character some text piece holds (word markers aside)."""
        text = "".join(p for i, p in enumerate(self.pieces) if i not in self.special)
        return frozenset(text.replace(self.marker, ""))


def hotword_vocabulary(tokenizer: Tokenizer) -> Vocabulary:
    """The model's pieces for hotword matching, with the word marker of its tokenizer's rule."""
    ids = list(range(tokenizer.vocab_size))
    special = frozenset(i for i, s in zip(ids, tokenizer.is_special(ids)) if s)
    marker = BYTE_LEVEL_SPACE if tokenizer.word_boundary == "byte-level" else METASPACE
    return Vocabulary(tuple(tokenizer.pieces(ids)), special, marker)


def hotword_words(phrases: Sequence[str]) -> list[str]:
    """The words of a request's hotword phrases, each once, in order: a phrase's words count one by one."""
    return list(dict.fromkeys(w for phrase in phrases for w in phrase.split()))


def hotword_bias(phrases: Sequence[str], boost: float, vocabulary: Vocabulary, model: str) -> HotwordBias:
    """A request's hotwords checked and split into words.

    Raises:
        ValueError: more than MAX_HOTWORDS words, a word over MAX_HOTWORD_CHARS characters or with characters
            the model never writes, or a boost outside (0, MAX_BOOST].
    """
    if not 0 < boost <= MAX_BOOST:
        raise ValueError(f"hotword_boost {boost} is out of range: use a number in (0, {MAX_BOOST:g}] (0 = the default)")
    words = hotword_words(phrases)
    if not words:
        raise ValueError("hotwords holds no word: send words separated by spaces, or none")
    if len(words) > MAX_HOTWORDS:
        raise ValueError(f"{len(words)} hotwords is over the limit of {MAX_HOTWORDS} words per request")
    for word in words:
        if len(word) > MAX_HOTWORD_CHARS:
            raise ValueError(f"hotword {word[:20]!r}... has {len(word)} characters; the limit is {MAX_HOTWORD_CHARS}")
        unwritable = sorted(c for c in set(word) if not set(vocabulary.spell(c)) <= vocabulary.letters)
        if unwritable:
            known = "".join(sorted(vocabulary.letters)) if len(vocabulary.letters) <= 64 else None
            raise ValueError(f"hotword {word!r} has characters model '{model}' never writes: {''.join(unwritable)!r}"
                             + (f"; it writes {known!r}" if known else ""))
    return HotwordBias([vocabulary.spell(w) for w in words], boost, vocabulary)


class HotwordBias:
    """The bonus of one request's hotwords, for any of its rows.

    Args:
        words: the hotwords (single words, spelled as the pieces write them: Vocabulary.spell).
        boost: the bonus per letter (> 0).
        vocabulary: the model's pieces.
    """

    def __init__(self, words: Sequence[str], boost: float, vocabulary: Vocabulary):
        self.words = frozenset(words)
        self.boost = boost
        self._pieces, self._marker = vocabulary.pieces, vocabulary.marker
        self._prefixes = {w[:i] for w in self.words for i in range(len(w) + 1)}
        self._starts_word = vocabulary.starts_word
        self._continuations = vocabulary.continuations
        self._openings = {k: v for k, v in vocabulary.openings.items() if k and k in self._prefixes}
        self._next: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # prefix -> (ids, gains), filled as met

    def current_word(self, tokens: np.ndarray) -> str:
        """The letters of the word the row is writing: its tokens since the last one that began a word."""
        starts = np.flatnonzero(self._starts_word[tokens])
        first = int(starts[-1]) if len(starts) else 0
        return "".join(self._pieces[t] for t in tokens[first:]).replace(self._marker, "")

    def bonus(self, word: str) -> float:
        """What writing `word` is worth while it is the start of a hotword (or a whole one): boost x its letters."""
        return self.boost * len(word) if word in self._prefixes else 0.0

    def deltas(self, tokens: np.ndarray) -> np.ndarray:
        """(V,) what each next token gains for a row that generated `tokens` (see the module docstring)."""
        word = self.current_word(tokens)
        out = self._starts_word * (self.boost * len(word) if word in self.words else 0.0)
        for opening, ids in self._openings.items():  # a marker piece whose letters start a hotword
            out[ids] += self.bonus(opening)
        if word in self._prefixes:
            ids, gains = self._continuing(word)
            out[ids] = gains
        return out

    def _continuing(self, word: str) -> tuple[np.ndarray, np.ndarray]:
        """The ids of the pieces that continue a hotword after `word`, and what each gains (computed once
        per prefix: every row of the request that reaches it asks again, step after step)."""
        if word not in self._next:
            ids, gains = [np.zeros(0, dtype=np.int64)], [np.zeros(0)]
            for hotword in self.words:
                if hotword.startswith(word):
                    rest = hotword[len(word):]
                    for j in range(1, len(rest) + 1):
                        found = self._continuations.get(rest[:j])
                        if found is not None:
                            ids.append(found)
                            gains.append(np.full(len(found), self.bonus(word + rest[:j])))
            self._next[word] = np.concatenate(ids), np.concatenate(gains)
        return self._next[word]
