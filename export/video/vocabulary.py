"""The clip captioner's output units: whole words, one `▁word` piece each, after the four specials
(export/image/vocabulary.py builds the tokenizer; this module only says which words)."""

from __future__ import annotations

from tokenizers import Tokenizer

from attnserve.export.image import vocabulary as image_vocabulary
from attnserve.export.video.clips import DIRECTIONS, EVENTS, OBJECT_SET

EOS_ID, PAD_ID, START_ID, UNK_ID = (image_vocabulary.EOS_ID, image_vocabulary.PAD_ID, image_vocabulary.START_ID,
                                    image_vocabulary.UNK_ID)
SPECIAL_TOKENS = image_vocabulary.SPECIAL_TOKENS
encode, suppressed_ids = image_vocabulary.encode, image_vocabulary.suppressed_ids


def caption_words() -> list[str]:
    """Every word a clip caption can hold, sorted."""
    words = {"a", "an"}
    for text in [*DIRECTIONS, *(o.name for o in OBJECT_SET), *EVENTS.values()]:
        words.update(w for w in text.split() if not w.startswith("{"))
    return sorted(words)


def word_tokenizer() -> Tokenizer:
    return image_vocabulary.word_tokenizer(caption_words())
