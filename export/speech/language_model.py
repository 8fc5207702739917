"""Builds the speech recognizer's character n-gram LM for shallow fusion (server/decoding/ngram_lm.py).

Its text is the transcript of every sentence the speech corpus may train on: the translation corpus's train
split, through the same selection and normalisation as the recordings (export/speech/text.py), so no dev or
test sentence is ever in it. `--manifests` adds the transcripts of speech manifests (e.g. the recorded
corpus's train.jsonl: its dialogue is nearer to what people say into a microphone than the translation
corpus's help texts). Reports the cross-entropy on the dev transcripts in bits per character.

    python -m attnserve.export.speech.language_model --corpus data/corpus --out /tmp/lm.npz --order 7 --min-count 3 \
        --manifests data/real-speech/train.jsonl
"""

from __future__ import annotations

import argparse
import json
import pathlib

from attnserve.export.common.ngram_build import bits_per_token, build
from attnserve.export.speech import manifest, vocabulary
from attnserve.export.speech.build import read_corpus
from attnserve.export.speech.text import select


def transcripts(corpus: pathlib.Path) -> dict[str, list[str]]:
    """Split name (train, dev, test) -> the transcripts of its readable sentences."""
    sentences, _ = select(read_corpus(corpus))
    by_split: dict[str, list[str]] = {}
    for s in sentences:
        by_split.setdefault(s.split, []).append(s.transcript)
    return by_split


def manifest_transcripts(paths: list[pathlib.Path]) -> list[str]:
    """The `text` of every row of these speech manifests."""
    return [row["text"] for p in paths for row in manifest.read(p)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=pathlib.Path, default=pathlib.Path("data/corpus"),
                        help="the translation corpus the speech corpus reads from")
    parser.add_argument("--out", type=pathlib.Path, required=True, help="the LM file to write (.npz)")
    parser.add_argument("--order", type=int, default=7, help="contexts of up to order - 1 characters")
    parser.add_argument("--min-count", type=int, default=3, help="contexts seen fewer times are left out")
    parser.add_argument("--manifests", type=pathlib.Path, nargs="*", default=[],
                        help="speech manifests (train splits only) whose transcripts join the text")
    args = parser.parse_args()
    tokenizer = vocabulary.character_tokenizer()
    text = transcripts(args.corpus)
    extra = manifest_transcripts(args.manifests)
    train, dev = (vocabulary.encode(tokenizer, text[split] + (extra if split == "train" else [])) for split in ("train", "dev"))
    lm = build(train, tokenizer.get_vocab_size(), args.order, vocabulary.START_ID, vocabulary.EOS_ID, args.min_count)
    lm.save(args.out)
    report = {
        "file": str(args.out), "order": lm.order, "min_count": args.min_count,
        "train_sentences": len(train), "from_manifests": len(extra), "train_characters": sum(map(len, train)),
        "contexts": sum(len(k) for k in lm.keys), "megabytes": round(args.out.stat().st_size / 1e6, 1),
        "dev_bits_per_character": round(bits_per_token(lm, dev, vocabulary.START_ID, vocabulary.EOS_ID), 3),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
