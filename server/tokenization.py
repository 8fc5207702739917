"""Text <-> token ids with a Hugging Face `tokenizers` file, and pieces -> words for word-level attention."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import unicodedata
from collections.abc import Iterable, Sequence

import tokenizers

from attnserve.server.manifest import Manifest

METASPACE = "▁"
# CJK radicals, punctuation, kana, bopomofo, ideographs, Hangul, compatibility and full-width forms, and the
# supplementary ideograph planes: each such character is a word of its own under `metaspace-cjk`.
_CJK = re.compile(
    "[\u2e80-\u2fff\u3000-\u303f\u3040-\u30ff\u3100-\u31ff\u3200-\u9fff\uac00-\ud7af"
    "\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef\U00020000-\U0003ffff]"
)


@dataclasses.dataclass(frozen=True)
class Words:
    """A grouping of consecutive pieces into words."""

    # Index of each word's first piece; starts[0] == 0 when there is any piece.
    starts: tuple[int, ...]
    # Display text of each word (metaspace markers removed).
    labels: tuple[str, ...]


class Tokenizer:
    """Wraps a `tokenizers.Tokenizer` with the manifest's special tokens and word-boundary rule.

    Args:
        tokenizer: the loaded tokenizer.
        eos: id appended to every source.
        special_ids: ids that always form a word of their own (pad, unk, eos, language tokens, ...).
        word_boundary: the manifest's `tokenizer.word_boundary`; only "metaspace-cjk" is known.
    """

    def __init__(self, tokenizer: tokenizers.Tokenizer, eos: int, special_ids: Iterable[int], word_boundary: str):
        if word_boundary != "metaspace-cjk":
            raise ValueError(f"unknown word_boundary rule {word_boundary!r}")
        self._tokenizer = tokenizer
        self.eos = eos
        self.vocab_size = tokenizer.get_vocab_size()
        added = tokenizer.get_added_tokens_decoder()
        self._special = frozenset(special_ids) | {i for i, token in added.items() if token.special}
        self._pieces = [tokenizer.id_to_token(i) or "" for i in range(self.vocab_size)]
        # Every piece covers at most this many characters of the text, so a text longer than
        # n * max_piece_chars is surely over n tokens: oversized input is refused without tokenizing it.
        self.max_piece_chars = max(
            (len(p) for i, p in enumerate(self._pieces) if i not in self._special), default=1
        )

    @classmethod
    def from_manifest(cls, folder: pathlib.Path, manifest: Manifest) -> Tokenizer:
        """Loads `<folder>/<manifest.tokenizer.file>`.

        Raises:
            ValueError: the file cannot be read as a tokenizer.
        """
        path = pathlib.Path(folder) / manifest.tokenizer.file
        try:
            tokenizer = tokenizers.Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception for bad files.
            raise ValueError(f"{path}: cannot load tokenizer: {exc}") from exc
        s = manifest.special_tokens
        special = {s.pad, s.unk, s.eos, *manifest.decoder_start.values()}
        size = tokenizer.get_vocab_size()
        out_of_range = sorted(i for i in special if i >= size)
        if out_of_range:
            raise ValueError(f"{path}: special or start token id(s) {out_of_range} >= vocabulary size {size}")
        return cls(tokenizer, s.eos, special, manifest.tokenizer.word_boundary)

    def encode(self, text: str) -> list[int]:
        """Source ids for `text`: the tokenizer's ids followed by EOS."""
        # encode_batch releases the GIL while it works (encode holds it): a long text tokenized on a
        # submitting thread must not stall the server's event loop.
        (encoding,) = self._tokenizer.encode_batch([text], add_special_tokens=False)
        return encoding.ids + [self.eos]

    def decode(self, ids: Sequence[int]) -> str:
        """Detokenized text; special tokens are dropped."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=True)

    def text_delta(self, previous: Sequence[int], new: int) -> str:
        """The text that token `new` adds after `previous` (what a stream prints; "" for special tokens)."""
        before, after = self.decode(previous), self.decode([*previous, new])
        return after[len(os.path.commonprefix([before, after])) :]  # detokenizing only appends

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The vocabulary piece of each id, e.g. "▁power"."""
        return [self._pieces[i] for i in ids]

    def words(self, ids: Sequence[int]) -> Words:
        """Groups pieces into words by the `metaspace-cjk` rule.

        A piece starts a new word if it starts with "▁", if it or the previous piece holds a CJK character,
        or if it is a special token. One refinement: a piece that is only "▁" (the tokenizer's word marker
        split off before a CJK character or an unknown piece) joins the word that follows it instead of
        being a blank word of its own.
        """
        pieces = self.pieces(ids)
        starts = []
        for i, piece in enumerate(pieces):
            if i == 0:
                starts.append(0)
                continue
            prev = pieces[i - 1]
            if prev == METASPACE and starts[-1] == i - 1:
                continue  # a lone marker opened this word
            if piece.startswith(METASPACE) or _CJK.search(piece) or _CJK.search(prev) or ids[i] in self._special:
                starts.append(i)
        ends = starts[1:] + [len(pieces)]
        labels = tuple(_label(pieces[a:b]) for a, b in zip(starts, ends))
        return Words(tuple(starts), labels)


# Characters that carry no text: controls (NUL, ...), format characters (zero-width spaces and joiners, the
# BOM, direction marks), separators and unassigned code points.
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp", "Cn"})


def check_text(text: str) -> None:
    """Refuses text a tokenizer would turn into junk.

    Raises:
        ValueError: the text holds an unpaired surrogate (not Unicode text), or no visible character at
            all (only whitespace, zero-width characters, a BOM, NULs or other controls).
    """
    visible = False
    for ch in text:
        category = unicodedata.category(ch)
        if category == "Cs":
            raise ValueError(f"text holds an unpaired surrogate (U+{ord(ch):04X}); send valid Unicode text")
        if category not in _INVISIBLE_CATEGORIES:
            visible = True
            break
    if not visible:
        raise ValueError("text is empty or invisible: only whitespace, zero-width characters, a BOM or NULs")
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in text):  # after the first visible character, if any
        raise ValueError("text holds an unpaired surrogate; send valid Unicode text")


def _label(pieces: Sequence[str]) -> str:
    text = "".join(pieces).replace(METASPACE, " ").strip()
    return text or METASPACE
