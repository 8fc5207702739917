"""The benchmarks' shared inputs: the model's flags and greedy requests on real test-split sentences."""

from __future__ import annotations

import argparse
import pathlib

from attnserve.export.translation.train import read_pairs
from attnserve.api.generation import GREEDY, GenerationRequest


def add_arguments(parser: argparse.ArgumentParser, sentences: int) -> None:
    """--models, --model, --split and --sentences (default `sentences`, half each direction)."""
    parser.add_argument("--models", type=pathlib.Path, default=pathlib.Path("models"))
    parser.add_argument("--model", default="translate-zh-en")
    parser.add_argument("--split", type=pathlib.Path, default=pathlib.Path("data/corpus/test.tsv"))
    parser.add_argument("--sentences", type=int, default=sentences, help="half zh->en, half en->zh")


def requests(args: argparse.Namespace) -> list[GenerationRequest]:
    """Greedy requests on the split's first --sentences / 2 pairs: the Chinese sides into English, then the
    English sides into Traditional Chinese."""
    pairs = read_pairs(args.split)[: args.sentences // 2]
    return [GenerationRequest(args.model, zh, "en", GREEDY) for _, zh in pairs] + [
        GenerationRequest(args.model, en, "zh-TW", GREEDY) for en, _ in pairs]
