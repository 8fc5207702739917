"""The output-unit conventions the speller and the captioners share: four special tokens in fixed ids, and
the `▁` metaspace marker that opens a word under the manifest's `metaspace-cjk` word boundary.

The translators' BPE vocabulary has its own specials (translation/bpe.py)."""

from __future__ import annotations

from tokenizers import Tokenizer

METASPACE = "▁"
# Fixed ids: the manifests, the CTC blank and the training code rely on this order.
SPECIAL_TOKENS = ["<pad>", "<unk>", "</s>", "<s>"]
PAD_ID, UNK_ID, EOS_ID, START_ID = 0, 1, 2, 3


def add_special_tokens(tokenizer: Tokenizer) -> Tokenizer:
    """Marks SPECIAL_TOKENS special, checking they hold their fixed ids (the pieces list them first)."""
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    for index, token in enumerate(SPECIAL_TOKENS):
        if tokenizer.token_to_id(token) != index:
            raise RuntimeError(f"special token {token} must have id {index}")
    return tokenizer


def suppressed_ids() -> list[int]:
    """Ids the served decoder never emits: padding, <unk> (never a target) and the start token."""
    return [PAD_ID, UNK_ID, START_ID]
