"""Does a served model's attention point at the right source word? Accuracy against a dictionary gold set.

For each test sentence the model translates (greedy, through the serving engine, word-level attention of
every decoder layer), the gold set is built from the model's *own output* with CC-CEDICT
(`export/translation/dictionary.py`), in both directions:

1. Words are the server's attention units (`metaspace-cjk`): every CJK character is a word, so a Chinese
   headword such as 銀行 spans two words; an English word is its pieces merged.
2. Each English content word looks up the Traditional headwords it clearly translates and finds where they
   occur in the Chinese sentence. Overlapping occurrences merge into one span (開 inside 開啟).
3. A link is kept only when it is unambiguous: the English word's headwords occur in exactly one span, and
   no other English word of the sentence (the same word repeated included) claims an overlapping span.
4. Each link gives one gold item: an output word and the set of source words it should attend to.
   English output (zh-TW->en): the English word's row -> every character of the Chinese span.
   Chinese output (en->zh-TW): the row of the span's *first character* -> the English word. Only the
   first row counts, so a headword is one item whatever its length, and it is the row at which the model
   chose the word. (The later rows of translate-zh-en's layer 1 put their largest weight on `</s>` more
   often than not; with `</s>` excluded they hit about as often as first rows.)

An item is a hit when the row's largest weight, over every source word but the `</s>` column, falls in the
gold set. Accuracy is reported per model, direction and decoder layer (mean over heads, as served), next to
two references computed on the same items: `diagonal`, the source word at the output word's proportional
position, and `chance`, the expected accuracy of a uniformly random source word.

    python -m attnserve.export.translation.alignment --models models --model translate-zh-en \
        --split data/corpus/test.tsv --limit 400 --out scores-alignment.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time
from collections.abc import Iterator, Sequence

import numpy as np

from attnserve.export.translation import dictionary as cedict
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.engine import ModelEngine
from attnserve.server.engine.registry import load_engine
from attnserve.api.generation import (
    AttentionGranularity,
    AttentionOptions,
    DecodingOptions,
    GenerationRequest,
    GenerationResult,
)
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions

# Direction -> (source column of the split's `en<TAB>zh` lines, source language, target language).
DIRECTIONS = {"en->zh-TW": (0, "en", "zh-TW"), "zh-TW->en": (1, "zh-TW", "en")}
# Stands for a Chinese-side word that is not one ideograph ("Python", "18.45%", "，"): no headword spans it.
_NOT_HANZI = "\0"
EXAMPLES = 5  # sentences with gold items shown per direction in the report


@dataclasses.dataclass(frozen=True)
class Link:
    """An English word and the occurrence of its dictionary counterpart in the Chinese sentence."""

    english: int  # word index on the English side
    chinese: tuple[int, ...]  # consecutive word indices (one per character) on the Chinese side


@dataclasses.dataclass(frozen=True)
class GoldItem:
    row: int  # output word index
    columns: frozenset[int]  # source word indices it should attend to (never the `</s>` column)


def english_key(label: str) -> str | None:
    """The dictionary word of an English word label ("user." -> "user"); None for a stop word or no word."""
    words = cedict.content_words(label)
    return words[0] if len(words) == 1 else None


def spans(text: str, headwords: frozenset[str]) -> list[tuple[int, int]]:
    """Where any of `headwords` occurs in `text`, overlapping occurrences merged.

    Returns:
        Sorted, disjoint (start, end) character ranges.
    """
    found = []
    for headword in headwords:
        start = text.find(headword)
        while start >= 0:
            found.append((start, start + len(headword)))
            start = text.find(headword, start + 1)
    merged: list[tuple[int, int]] = []
    for start, end in sorted(found):
        if merged and start < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def links(english: Sequence[str], chinese: Sequence[str], dictionary: cedict.Dictionary) -> list[Link]:
    """The unambiguous dictionary links between the words of an English and a Chinese sentence.

    Args:
        english, chinese: word labels of each side (`</s>` excluded).
    """
    text = "".join(w if len(w) == 1 and cedict.is_hanzi(w) else _NOT_HANZI for w in chinese)  # a char per word
    claims = {}  # English word index -> its headwords' spans in the Chinese sentence
    for i, label in enumerate(english):
        key = english_key(label)
        if key is not None:
            claims[i] = spans(text, dictionary.headwords(key))
    found = []
    for i, own in claims.items():
        if len(own) != 1:
            continue  # no counterpart, or several places it could be
        start, end = own[0]
        if any(s < end and start < e for j, other in claims.items() if j != i for s, e in other):
            continue  # another English word (or this one repeated) may own the same characters
        found.append(Link(i, tuple(range(start, end))))
    return found


def gold_items(
    source: Sequence[str], output: Sequence[str], chinese_output: bool, dictionary: cedict.Dictionary
) -> list[GoldItem]:
    """The gold items of one translation (see the module docstring, step 4).

    Args:
        source: source word labels, `</s>` excluded; output: output word labels.
        chinese_output: whether the output is the Chinese side.
    """
    if chinese_output:
        return [GoldItem(link.chinese[0], frozenset({link.english})) for link in links(source, output, dictionary)]
    return [GoldItem(link.english, frozenset(link.chinese)) for link in links(output, source, dictionary)]


def attention_hits(weights: Sequence[Sequence[float]], items: Sequence[GoldItem]) -> list[bool]:
    """Whether each item's most-attended source word, `</s>` excluded, is in its gold set.

    Args:
        weights: (R, S + 1) word-level attention: a row per output word, a column per source word, the
            `</s>` column last.
    """
    w = np.asarray(weights, dtype=np.float64)[:, :-1]  # (R, S)
    return [int(w[item.row].argmax()) in item.columns for item in items]


def diagonal_column(row: int, rows: int, columns: int) -> int:
    """The source word at output word `row`'s proportional position (rows, columns: sentence lengths)."""
    return min(int((row + 0.5) * columns / rows), columns - 1)


@dataclasses.dataclass
class Tally:
    """Gold items and hits of one model and direction (or one corpus family of it)."""

    layers: int
    sentences: int = 0  # translated sentences
    skipped: int = 0  # refused by the model, or whose output differed between layer requests
    items: int = 0
    hits: list[int] = dataclasses.field(init=False)  # per layer
    diagonal: int = 0
    chance: float = 0.0  # expected hits of a uniformly random source word

    def __post_init__(self):
        self.hits = [0] * self.layers

    def add(self, items: Sequence[GoldItem], matrices: Sequence[Sequence[Sequence[float]]]) -> None:
        """Counts one sentence: its gold items against the attention of every layer (matrices[layer])."""
        self.sentences += 1
        self.items += len(items)
        for layer, weights in enumerate(matrices):
            self.hits[layer] += sum(attention_hits(weights, items))
        if items:
            rows, columns = len(matrices[0]), len(matrices[0][0]) - 1  # `</s>` is no candidate
            self.diagonal += sum(diagonal_column(it.row, rows, columns) in it.columns for it in items)
            self.chance += sum(len(it.columns) / columns for it in items)

    def report(self) -> dict:
        def share(hits: float) -> float | None:
            return round(hits / self.items, 4) if self.items else None

        return {
            "sentences": self.sentences,
            "skipped": self.skipped,
            "gold_items": self.items,
            "layers": [{"layer": i, "hits": h, "accuracy": share(h)} for i, h in enumerate(self.hits)],
            "diagonal": {"hits": self.diagonal, "accuracy": share(self.diagonal)},
            "chance": share(self.chance),
        }


def translate_all_layers(
    engine: ModelEngine, texts: Sequence[str], target: str, max_new_tokens: int, batching: BatchingOptions
) -> Iterator[list[GenerationResult] | None]:
    """Each text translated once per decoder layer, with that layer's word-level attention.

    Yields, in order: the results of layers 0..L-1 (L from the manifest), or None when the model refused
    the text (too long) or the outputs of the layer requests differ (they should not: same greedy search).
    """
    name, layers = engine.manifest.name, engine.manifest.attention.layers
    chunk = max(1, batching.max_queue_size // layers)  # never more queued requests than the batcher takes
    for begin in range(0, len(texts), chunk):
        pending = []
        for text in texts[begin : begin + chunk]:
            try:
                pending.append([
                    engine.submit(GenerationRequest(
                        name, text, target, DecodingOptions(max_new_tokens),
                        AttentionOptions(True, layer, AttentionGranularity.WORDS),
                    ))
                    for layer in range(layers)
                ])
            except ValueError:
                pending.append(None)
        for futures in pending:
            results = None if futures is None else [f.result() for f in futures]
            same = results is not None and len({tuple(t.id for t in r.tokens) for r in results}) == 1
            yield results if same else None


def score_model(
    engine: ModelEngine,
    pairs: Sequence[tuple[str, str]],
    families: Sequence[str],
    dictionary: cedict.Dictionary,
    max_new_tokens: int = 128,
    batching: BatchingOptions = BatchingOptions(),
) -> dict:
    """Alignment accuracy of one served model in each direction it supports."""
    m = engine.manifest
    eos = engine.tokenizer.pieces([m.special_tokens.eos])[0]
    report = {
        "model": m.name, "version": m.version, "attention_layers": m.attention.layers,
        "attention_heads": m.attention.heads, "default_layer": m.attention.default_layer % m.attention.layers,
        "directions": {},
    }
    for direction, (column, source_language, target) in DIRECTIONS.items():
        if source_language not in m.source_languages or target not in m.target_languages:
            continue
        started = time.perf_counter()
        total, by_family, examples = Tally(m.attention.layers), {}, []
        texts = [pair[column] for pair in pairs]
        translations = translate_all_layers(engine, texts, target, max_new_tokens, batching)
        for text, family, results in zip(texts, families, translations):
            tallies = [total, by_family.setdefault(family, Tally(m.attention.layers))]
            if results is None:
                for tally in tallies:
                    tally.skipped += 1
                continue
            # The gold set comes from the output and the word labels, the same for every layer.
            matrices = [r.attention for r in results]
            if matrices[0].col_labels[-1] != eos:
                raise RuntimeError(f"the last source word is {matrices[0].col_labels[-1]!r}, not {eos!r}")
            items = gold_items(matrices[0].col_labels[:-1], matrices[0].row_labels, target == "zh-TW", dictionary)
            for tally in tallies:
                tally.add(items, [matrix.weights for matrix in matrices])
            if items and len(examples) < EXAMPLES:
                examples.append(_example(text, results[0].text, matrices, items))
        report["directions"][direction] = {
            **total.report(),
            "seconds": round(time.perf_counter() - started, 1),
            "by_family": {family: tally.report() for family, tally in sorted(by_family.items())},
            "examples": examples,
        }
    return report


def _example(source: str, output: str, matrices: Sequence, items: Sequence[GoldItem]) -> dict:
    """One sentence's gold items in words, with the word each layer's attention picked."""
    rows, cols = matrices[0].row_labels, matrices[0].col_labels
    return {
        "source": source,
        "output": output,
        "items": [
            {
                "output_word": rows[item.row],
                "gold": [cols[c] for c in sorted(item.columns)],
                "argmax_by_layer": [cols[int(np.argmax(m.weights[item.row][:-1]))] for m in matrices],
            }
            for item in items
        ],
    }


def read_split(path: pathlib.Path, limit: int = 0) -> tuple[list[tuple[str, str]], list[str]]:
    """The (en, zh) pairs of a corpus split and each pair's family (`hsk`, `gettext`, ...).

    The family comes from the line-aligned `.source` file beside the split ("all" without one).
    """
    lines = path.read_text(encoding="utf-8").splitlines()
    pairs = [tuple(line.split("\t")[:2]) for line in (lines[:limit] if limit else lines)]
    origins = path.with_suffix(".source")
    if origins.exists():
        families = [line.split("/")[0] for line in origins.read_text(encoding="utf-8").splitlines()]
    else:
        families = ["all"] * len(pairs)
    return pairs, families[: len(pairs)]


def evaluate(
    repository: pathlib.Path, names: Sequence[str], split: pathlib.Path, limit: int = 0,
    max_new_tokens: int = 128, threads: int = 1,
) -> dict:
    """Scores the named models of a repository on a split (see the module docstring).

    Raises:
        ValueError: a named model is not in the repository, or the repository is broken.
    """
    models = find_models(repository)
    missing = [name for name in names if name not in models]
    if missing:
        raise ValueError(f"no model {', '.join(missing)} in {repository}; available: {', '.join(models)}")
    dictionary = cedict.load()
    pairs, families = read_split(split, limit)
    report = {
        "split": str(split),
        "pairs": len(pairs),
        "dictionary": {
            "name": "CC-CEDICT", "release": dictionary.date, "licence": cedict.LICENCE, "package": cedict.PACKAGE,
            "headwords": len(dictionary),
        },
        "models": {},
    }
    batching = BatchingOptions()
    for name in names:
        engine = load_engine(models[name], RuntimeOptions(intra_op_threads=threads), batching)
        try:
            report["models"][name] = score_model(engine, pairs, families, dictionary, max_new_tokens, batching)
        finally:
            engine.close()
    return report


def format_table(report: dict) -> str:
    """Accuracy per model, direction and layer, with the baselines: a plain-text table."""

    def cell(accuracy: float | None) -> str:
        return "-" if accuracy is None else f"{accuracy:.3f}"

    most = max((m["attention_layers"] for m in report["models"].values()), default=0)
    rows = [["model", "direction", "gold items", *[f"layer {i}" for i in range(most)], "diagonal", "chance"]]
    for name, model in report["models"].items():
        for direction, scores in model["directions"].items():
            layers = [cell(layer["accuracy"]) for layer in scores["layers"]]
            rows.append([
                name, direction, str(scores["gold_items"]), *layers, *[""] * (most - len(layers)),
                cell(scores["diagonal"]["accuracy"]), cell(scores["chance"]),
            ])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in rows
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=pathlib.Path, default=pathlib.Path("models"), help="model repository")
    parser.add_argument("--model", action="append", required=True, help="a model to score (repeatable)")
    parser.add_argument("--split", type=pathlib.Path, default=pathlib.Path("data/corpus/test.tsv"))
    parser.add_argument("--limit", type=int, default=0, help="score only the first N pairs (0 = all)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    parser.add_argument("--out", type=pathlib.Path, help="write the full report (JSON) here")
    args = parser.parse_args()
    report = evaluate(args.models, args.model, args.split, args.limit, args.max_new_tokens, args.threads)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(format_table(report))


if __name__ == "__main__":
    main()
