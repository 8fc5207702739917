"""Scores reranking by translating back (`DecodingOptions.reverse_weight`) as served, beside the plain beam
search, on a split's everyday and software rows in both directions: the figures of
docs/translation-quality.md.

    python -m attnserve.export.translation.reranking_eval --models models --split data/corpus/test.tsv \\
        --searches 4:0 8:0 8:0.1 --software-rows 400 --out models/translate-zh-en/reranking.json

Each search is BEAMS:WEIGHT. The everyday rows are the split's HSK and Tatoeba pairs (all of them), the
software rows the first N pairs of no other domain (export/translation/evaluate.py's domains).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

from attnserve.export.translation.evaluate import DIRECTIONS, domain_rows, open_engine, read_families, score, translate_with
from attnserve.export.translation.train import read_pairs


def parse_search(text: str) -> tuple[int, float]:
    beams, _, weight = text.partition(":")
    return int(beams), float(weight or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=pathlib.Path, default=pathlib.Path("models"))
    parser.add_argument("--model", default="translate-zh-en")
    parser.add_argument("--split", type=pathlib.Path, default=pathlib.Path("data/corpus/test.tsv"))
    parser.add_argument("--searches", nargs="+", type=parse_search, default=[(4, 0.0), (8, 0.0), (8, 0.1)],
                        metavar="BEAMS:WEIGHT")
    parser.add_argument("--software-rows", type=int, default=400)
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    pairs = read_pairs(args.split)
    domains = domain_rows(read_families(args.split, len(pairs)))
    rows = {"everyday": domains["everyday"], "software": domains["software"][: args.software_rows]}
    engine = open_engine(args.models, args.model)
    report = {"model": args.model, "version": engine.manifest.version, "split": str(args.split),
              "rows": {name: len(r) for name, r in rows.items()}, "scores": []}
    try:
        for direction, (src_col, tgt_col, target) in DIRECTIONS.items():
            for domain, indices in rows.items():
                sources = [pairs[i][src_col] for i in indices]
                references = [pairs[i][tgt_col] for i in indices]
                for beams, weight in args.searches:
                    started = time.perf_counter()
                    outputs = translate_with(engine, sources, target, beam_size=beams, reverse_weight=weight)
                    entry = {"direction": direction, "domain": domain, "beam_size": beams, "reverse_weight": weight,
                             **score(outputs, references, target), "seconds": round(time.perf_counter() - started, 1)}
                    report["scores"].append(entry)
                    print(f"| {direction} | {domain} | {beams} | {weight:g} | {entry['chrf']:.2f} "
                          f"| {entry['bleu']:.2f} | {entry['seconds']:.0f} s |", flush=True)
    finally:
        engine.close()
    if args.out:
        args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
