"""The shared English / Traditional Chinese BPE vocabulary, trained with Hugging Face `tokenizers`.

Pieces never cross a CJK character (each becomes its own pre-token), and words carry a `▁` marker, so the
server can merge pieces back into words without a Chinese segmenter (docs/model-contract.md,
`word_boundary: metaspace-cjk`).
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

# Fixed ids: the manifest and the training code rely on this order.
SPECIAL_TOKENS = ["<pad>", "<unk>", "</s>", "<s>", "<2en>", "<2zh-TW>"]
PAD_ID, UNK_ID, EOS_ID = 0, 1, 2
LANGUAGE_TOKENS = {"en": "<2en>", "zh-TW": "<2zh-TW>"}

# CJK ideographs, kana, CJK and full-width punctuation: each is split off on its own.
CJK_PATTERN = r"[\u2E80-\u2FFF\u3000-\u303F\u3040-\u9FFF\uF900-\uFAFF\uFE30-\uFE4F\uFF00-\uFFEF]"


# Sentence punctuation split off words ("pet." -> "pet" "."), so a word has one piece however a sentence ends.
PUNCTUATION_PATTERN = r"[.,!?;:\"()]"


def new_tokenizer(split_punctuation: bool = False) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    # NFC only: NFKC would fold full-width Chinese punctuation (，。) into ASCII.
    tokenizer.normalizer = normalizers.NFC()
    splits = [pre_tokenizers.Split(Regex(CJK_PATTERN), "isolated")]
    if split_punctuation:
        splits.append(pre_tokenizers.Split(Regex(PUNCTUATION_PATTERN), "isolated"))
    # Split pieces carry no "▁": the server's word grouping joins them to the word before.
    metaspace = pre_tokenizers.Metaspace("▁", prepend_scheme="first")
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([*splits, metaspace])
    tokenizer.decoder = decoders.Metaspace("▁", prepend_scheme="first")
    return tokenizer


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    min_frequency: int = 2,
    alphabet_limit: int | None = None,
    split_punctuation: bool = False,
) -> Tokenizer:
    """Trains the shared vocabulary on both languages' text.

    `alphabet_limit` keeps only the most frequent characters (the rest become <unk>): a dictionary's rare
    ideographs would otherwise each take a vocabulary entry from the English subwords.
    """
    tokenizer = new_tokenizer(split_punctuation)
    limits = {} if alphabet_limit is None else {"limit_alphabet": alphabet_limit}  # the trainer takes no None
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        **limits,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    for index, token in enumerate(SPECIAL_TOKENS):
        assert tokenizer.token_to_id(token) == index, f"special token {token} must have id {index}"
    return tokenizer


def language_token_ids(tokenizer: Tokenizer) -> dict[str, int]:
    return {lang: tokenizer.token_to_id(token) for lang, token in LANGUAGE_TOKENS.items()}


def suppressed_ids(tokenizer: Tokenizer) -> list[int]:
    """Tokens a decoder must never emit: padding, the unused <s>, and the language tags it starts with."""
    return [PAD_ID, tokenizer.token_to_id("<s>"), *language_token_ids(tokenizer).values()]


def main() -> None:
    """Trains the vocabulary of a corpus (both sides of its train split) into a tokenizer.json."""
    import argparse
    import pathlib

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--corpus", type=pathlib.Path, default=pathlib.Path("data/corpus"))
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--vocab-size", type=int, default=16000)
    parser.add_argument("--alphabet-limit", type=int, help="keep only this many most frequent characters")
    parser.add_argument("--split-punctuation", action="store_true")
    args = parser.parse_args()
    texts = [
        text
        for line in (args.corpus / "train.tsv").read_text(encoding="utf-8").splitlines()
        for text in line.split("\t")
    ]
    tokenizer = train_tokenizer(texts, args.vocab_size, alphabet_limit=args.alphabet_limit,
                                split_punctuation=args.split_punctuation)
    tokenizer.save(str(args.out))
    print(f"{args.out}: {tokenizer.get_vocab_size()} pieces from {len(texts)} texts")


if __name__ == "__main__":
    main()
