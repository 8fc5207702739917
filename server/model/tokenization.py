"""Text <-> token ids with a Hugging Face `tokenizers` file, and pieces -> words for word-level attention."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import unicodedata
from collections.abc import Iterable, Sequence

import tokenizers

from attnserve.server.model.manifest import WORD_BOUNDARIES, Manifest

METASPACE = "▁"
BYTE_LEVEL_SPACE = "Ġ"  # byte-level BPE's stand-in for the space byte (0x20)
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
        word_boundary: the manifest's `tokenizer.word_boundary`: "metaspace-cjk" or "byte-level".
    """

    def __init__(self, tokenizer: tokenizers.Tokenizer, eos: int, special_ids: Iterable[int], word_boundary: str):
        if word_boundary not in WORD_BOUNDARIES:
            raise ValueError(f"unknown word_boundary rule {word_boundary!r}")
        self.word_boundary = word_boundary
        self._tokenizer = tokenizer
        self.eos = eos
        self.vocab_size = tokenizer.get_vocab_size()
        # The tokenizer that reads text sources (`encode`, source pieces and words): this one, unless the
        # manifest names a source tokenizer of its own (tokenizer.source).
        self.source = self
        # A source tokenizer's encoder vocabulary (piece -> id) and unk id; None for one that numbers its
        # pieces as the encoder does.
        self._vocab: dict[str, int] | None = None
        self._unk: int | None = None
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
        output = cls(tokenizer, s.eos, special, manifest.tokenizer.word_boundary)
        if manifest.tokenizer.source is not None:
            output.source = cls._source(pathlib.Path(folder), manifest, special)
            output.max_piece_chars = output.source.max_piece_chars  # it bounds the text a source may be
        return output

    @classmethod
    def _source(cls, folder: pathlib.Path, manifest: Manifest, special: set[int]) -> Tokenizer:
        """The manifest's source tokenizer, reading ids in the encoder's own vocabulary."""
        spec = manifest.tokenizer.source
        path = folder / spec.file
        try:
            tokenizer = tokenizers.Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception for bad files.
            raise ValueError(f"{path}: cannot load tokenizer: {exc}") from exc
        vocab = _read_vocabulary(folder / spec.vocab)
        s = manifest.special_tokens
        if tokenizer.get_vocab_size() < len(vocab) or max(s.unk, s.eos) >= len(vocab):
            raise ValueError(f"{path}: has {tokenizer.get_vocab_size()} pieces for a source vocabulary of "
                             f"{len(vocab)}, which must hold the unk and eos ids {s.unk}, {s.eos}")
        source = cls(tokenizer, s.eos, {i for i in special if i < len(vocab)}, manifest.tokenizer.word_boundary)
        source._vocab, source._unk = vocab, s.unk
        # Column labels are the vocabulary's pieces (the tokenizer holds placeholders where its segmenter
        # has no such piece).
        by_id = {i: piece for piece, i in vocab.items()}
        source._pieces = [by_id[i] for i in range(len(vocab))]
        return source

    def encode(self, text: str) -> list[int]:
        """Source ids for `text`: the tokenizer's ids followed by EOS."""
        # encode_batch releases the GIL while it works (encode holds it): a long text tokenized on a
        # submitting thread must not stall the server's event loop.
        if self.source is not self:
            return self.source.encode(text)
        (encoding,) = self._tokenizer.encode_batch([text], add_special_tokens=False)
        if self._unk is None:
            return encoding.ids + [self.eos]
        return self._known_ids(text, encoding) + [self.eos]

    def _known_ids(self, text: str, encoding: tokenizers.Encoding) -> list[int]:
        """A source tokenizer's ids in the encoder's vocabulary: pieces it lacks are unk, and a run of
        characters the segmenter did not know is looked up by its normalised text (transformers' Marian
        and M2M100 tokenizers look SentencePiece's unknown pieces up in vocab.json the same way)."""
        size = len(self._vocab)
        ids = [i if i < size else self._unk for i in encoding.ids]
        normalizer = self._tokenizer.normalizer
        for k, (start, end) in enumerate(encoding.offsets):
            if ids[k] == self._unk:
                surface = text[start:end] if normalizer is None else normalizer.normalize_str(text[start:end])
                ids[k] = self._vocab.get(surface, self._unk)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Detokenized text; special tokens are dropped, and the spaces at both ends (a word marker opening
        the text, a lone one closing it; docs/model-contract.md)."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=True).strip(" ")

    def text_delta(self, previous: Sequence[int], new: int) -> str:
        """The text that token `new` adds after `previous` (what a stream prints; "" for special tokens)."""
        before, after = self.decode(previous), self.decode([*previous, new])
        return after[len(os.path.commonprefix([before, after])) :]  # detokenizing only appends

    def is_special(self, ids: Sequence[int]) -> list[bool]:
        """Whether each id is a special token (a word of its own that decode drops)."""
        return [i in self._special for i in ids]

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The vocabulary piece of each id, e.g. "▁power"."""
        return [self._pieces[i] for i in ids]

    def words(self, ids: Sequence[int]) -> Words:
        """Groups pieces into words by the manifest's rule (`metaspace-cjk`, or `byte-level`: _byte_level_words)."""
        if self.word_boundary == "byte-level":
            return self._byte_level_words(ids)
        return self._metaspace_words(ids)

    def _byte_level_words(self, ids: Sequence[int]) -> Words:
        """Byte-level BPE (GPT-2, Whisper): a piece starts a word if it starts with "Ġ" (the byte of a space),
        or it or the previous piece is a special token; labels are the words' decoded text."""
        pieces = self.pieces(ids)
        starts = [i for i, piece in enumerate(pieces) if i == 0 or piece.startswith(BYTE_LEVEL_SPACE)
                  or ids[i] in self._special or ids[i - 1] in self._special]
        ends = starts[1:] + [len(pieces)]
        labels = tuple(self._tokenizer.decode(list(ids[a:b]), skip_special_tokens=False).strip() or pieces[a]
                       for a, b in zip(starts, ends))
        return Words(tuple(starts), labels)

    def _metaspace_words(self, ids: Sequence[int]) -> Words:
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


def _read_vocabulary(path: pathlib.Path) -> dict[str, int]:
    """A JSON vocabulary piece -> id with ids 0..N-1.

    Raises:
        ValueError: naming the file, when it cannot be read or is not such an object.
    """
    try:
        vocab = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the source vocabulary: {exc}") from exc
    if not isinstance(vocab, dict) or sorted(vocab.values()) != list(range(len(vocab))):
        raise ValueError(f"{path}: not a vocabulary of pieces numbered 0..N-1")
    return vocab


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
