"""The speller's output units: characters, written as a Hugging Face `tokenizers` file the server reads.

One piece per character of the corpus ALPHABET (export/speech/text.py), the space written as the metaspace
marker `▁`, after four special tokens in fixed ids. Under the manifest's `metaspace-cjk` word boundary a
lone `▁` opens the word that follows it, so the server merges characters into words for word-level
attention with no rule of its own: "he asked" is `h e ▁ a s k e d`, words "he" and "asked".

Training encodes transcripts with this same tokenizer, so the ids the model learns are the ids the server
detokenizes.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from attnserve.export.common.vocabulary import (EOS_ID, METASPACE, PAD_ID, SPECIAL_TOKENS, START_ID, UNK_ID,
                                               add_special_tokens, suppressed_ids)
from attnserve.export.speech.text import ALPHABET

__all__ = ["BLANK_ID", "CHARACTERS", "EOS_ID", "MAX_CHARACTERS_PER_SECOND", "METASPACE", "PAD_ID", "SPECIAL_TOKENS",
           "START_ID", "UNK_ID", "character_tokenizer", "encode", "suppressed_ids"]
# The CTC branch (training only) uses <pad> as its blank: padding is never a target.
BLANK_ID = PAD_ID
CHARACTERS = [METASPACE if ch == " " else ch for ch in ALPHABET]
# No corpus clip reads faster: decoding stops here, so a speller caught in a loop ends near the clip's length.
MAX_CHARACTERS_PER_SECOND = 32


def character_tokenizer() -> Tokenizer:
    """Specials, then `▁`-for-space and the letters in ALPHABET order: 32 ids for the corpus alphabet."""
    pieces = SPECIAL_TOKENS + sorted(CHARACTERS, key=lambda ch: (ch != METASPACE, ch))
    tokenizer = Tokenizer(models.WordLevel({piece: i for i, piece in enumerate(pieces)}, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Replace(" ", METASPACE)
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")  # every character alone
    # Pieces joined with `▁` read as spaces, a leading one dropped. (Not Strip: tokenizers 0.23 panics when
    # it strips a lone space, which a speller that emits only `▁` would make the server decode.)
    tokenizer.decoder = decoders.Metaspace(METASPACE, prepend_scheme="first")
    return add_special_tokens(tokenizer)


def encode(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Transcripts -> character ids (no start or end token).

    Raises:
        ValueError: a transcript holds a character outside the vocabulary (it would be learnt as <unk>).
    """
    encoded = [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    for text, ids in zip(texts, encoded):
        if UNK_ID in ids:
            raise ValueError(f"transcript {text!r} holds characters outside the speller's vocabulary")
    return encoded
