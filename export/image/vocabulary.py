"""The captioner's output units: whole words, written as a Hugging Face `tokenizers` file the server reads.

Every word of every caption the scene grammar can write (export/image/scenes.py) is one piece, `▁` + word,
after the four special tokens in their fixed ids (export/common/vocabulary.py). Under the
manifest's `metaspace-cjk` word boundary each piece opens a word of its own, so word-level attention is
piece-level attention and a two-word name ("red apple") is two words, each with its own attention row.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from attnserve.export.image.objects import OBJECTS
from attnserve.export.image.scenes import RELATIONS
from attnserve.export.common.vocabulary import (EOS_ID, METASPACE, PAD_ID, SPECIAL_TOKENS, START_ID, UNK_ID,
                                               add_special_tokens, suppressed_ids)

__all__ = ["EOS_ID", "PAD_ID", "SPECIAL_TOKENS", "START_ID", "UNK_ID", "caption_words", "encode", "suppressed_ids",
           "word_tokenizer"]


def caption_words() -> list[str]:
    """Every word a caption can hold, sorted."""
    words = {"a", "an", "two", "small", "big"}
    for text in [*RELATIONS, *(o.name for o in OBJECTS), *(o.plural for o in OBJECTS)]:
        words.update(text.split())
    return sorted(words)


def word_tokenizer(words: list[str] | None = None) -> Tokenizer:
    """Specials, then `▁word` for each caption word."""
    pieces = SPECIAL_TOKENS + [METASPACE + w for w in (words or caption_words())]
    tokenizer = Tokenizer(models.WordLevel({piece: i for i, piece in enumerate(pieces)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(METASPACE, prepend_scheme="always", split=True)
    tokenizer.decoder = decoders.Metaspace(METASPACE, prepend_scheme="always")
    return add_special_tokens(tokenizer)


def encode(tokenizer: Tokenizer, captions: list[str]) -> list[list[int]]:
    """Captions -> word ids (no start or end token).

    Raises:
        ValueError: a caption holds a word outside the vocabulary.
    """
    encoded = [e.ids for e in tokenizer.encode_batch(captions, add_special_tokens=False)]
    for text, ids in zip(captions, encoded):
        if UNK_ID in ids:
            raise ValueError(f"caption {text!r} holds words outside the captioner's vocabulary")
    return encoded
