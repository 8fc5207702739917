"""Gives characters the shared BPE vocabulary lacks their own tokens, and a checkpoint rows for them.

The vocabulary was trained on version 1's corpus (software text and the HSK sentences). Sources added since
(Tatoeba, CC-CEDICT) use everyday characters it never saw, and each became <unk>: 謊 "lie", 嬰 "baby",
胸 "chest", 狼 "wolf"... (6,394 distinct characters, 39,330 occurrences in the train split). This appends
the frequent ones to the vocabulary as single-character tokens (no merges: every existing text tokenizes
as before) and copies the <unk> embedding into their rows, so the model starts out treating them as it
treated <unk> and training tells them apart.

    python -m attnserve.export.translation.extend_vocabulary --checkpoint RUN/last.pt --corpus data/corpus \
        --min-count 10 --out ~/.cache/attnserve/runs/zh-en-v3-extended.pt

The output is a checkpoint for `attnserve.export.translation.train --init-from` (weights, architecture, tokenizer).
"""

from __future__ import annotations

import argparse
import json
import pathlib
from collections import Counter
from collections.abc import Iterable

import torch
from tokenizers import Tokenizer

from attnserve.export.translation.train import read_pairs


def unknown_characters(tokenizer: Tokenizer, texts: Iterable[str]) -> Counter:
    """Each character the tokenizer turns into <unk>, with how often it occurs in the texts."""
    unk = tokenizer.token_to_id("<unk>")
    counts: Counter = Counter()
    for text in texts:
        encoding = tokenizer.encode(text, add_special_tokens=False)
        for token, (start, end) in zip(encoding.ids, encoding.offsets):
            if token == unk:
                counts.update(text[start:end])
    return counts


def extended_tokenizer(tokenizer: Tokenizer, characters: list[str]) -> Tokenizer:
    """The tokenizer with each character appended to its BPE vocabulary, ids from the old size on."""
    data = json.loads(tokenizer.to_str())
    vocab = data["model"]["vocab"]
    size = tokenizer.get_vocab_size()
    new = [ch for ch in dict.fromkeys(characters) if ch not in vocab]
    for offset, ch in enumerate(new):
        vocab[ch] = size + offset
    return Tokenizer.from_str(json.dumps(data, ensure_ascii=False))


def extended_embedding(weight: torch.Tensor, rows: int, unk_id: int) -> torch.Tensor:
    """(V, D) -> (V + rows, D): the new rows are copies of <unk>'s."""
    return torch.cat([weight, weight[unk_id].expand(rows, -1)], dim=0)


def extend_checkpoint(checkpoint: dict, characters: list[str]) -> dict:
    """A checkpoint whose tokenizer and (tied) embedding also cover `characters`."""
    tokenizer = Tokenizer.from_str(checkpoint["tokenizer"])
    extended = extended_tokenizer(tokenizer, characters)
    added = extended.get_vocab_size() - tokenizer.get_vocab_size()
    model = dict(checkpoint["model"])
    model["embed.weight"] = extended_embedding(model["embed.weight"], added, tokenizer.token_to_id("<unk>"))
    config = {**checkpoint["config"], "vocab_size": extended.get_vocab_size()}
    state = {**checkpoint.get("state", {}), "vocabulary_extended": {"from": tokenizer.get_vocab_size(), "added": added}}
    return {"model": model, "arch": checkpoint.get("arch", "transformer"), "config": config,
            "tokenizer": extended.to_str(), "state": state}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=pathlib.Path, required=True)
    parser.add_argument("--corpus", type=pathlib.Path, default=pathlib.Path("data/corpus"))
    parser.add_argument("--min-count", type=int, default=10, help="characters seen fewer times stay <unk>")
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args()
    checkpoint = torch.load(args.checkpoint, map_location="cpu", weights_only=False)
    tokenizer = Tokenizer.from_str(checkpoint["tokenizer"])
    counts = unknown_characters(tokenizer, (text for pair in read_pairs(args.corpus / "train.tsv") for text in pair))
    chosen = [ch for ch, n in counts.most_common() if n >= args.min_count]
    torch.save(extend_checkpoint(checkpoint, chosen), args.out)
    print(json.dumps({
        "unknown_characters": len(counts), "unknown_occurrences": sum(counts.values()),
        "added": len(chosen), "occurrences_covered": sum(counts[ch] for ch in chosen),
        "vocab_size": tokenizer.get_vocab_size() + len(chosen), "most_frequent": "".join(chosen[:40]),
    }, ensure_ascii=False, indent=2))


if __name__ == "__main__":
    main()
