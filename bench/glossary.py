"""Glossary term accuracy and chrF on held-out sentences, with the default glossary and without, side by side.

    python bench/glossary.py [--models models] [--out bench/results/glossary.json]

Each sentence of bench/glossary/held_out.tsv holds at least one term of the bundled translator's default
glossary (models/translate-zh-en/glossary.tsv). Both runs use the model's default search (its beam); the
glossary run sets use_default_glossary. Term accuracy: the share of (sentence, term) pairs whose output
contains the term's target (case-insensitive); chrF (sacrebleu, the `export` extra) against the references,
per direction and overall.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import sacrebleu

from attnserve.server.decoding import glossary
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.registry import load_engines
from attnserve.api.generation import DecodingOptions, GenerationRequest
from attnserve.server.model.runtime import RuntimeOptions

HERE = pathlib.Path(__file__).resolve().parent
MODEL = "translate-zh-en"


def sentences() -> list[tuple[str, str, str]]:
    lines = (HERE / "glossary" / "held_out.tsv").read_text(encoding="utf-8").splitlines()
    return [tuple(line.split("\t")) for line in lines if line.strip() and not line.startswith("#")]


def measure(engine, rows, terms: dict[str, str], use_glossary: bool) -> dict:
    start = time.perf_counter()
    futures = [engine.submit(GenerationRequest(MODEL, text=source, target_language=to,
                                               decoding=DecodingOptions(use_default_glossary=use_glossary)))
               for source, to, _ in rows]
    outputs = [f.result(600).text for f in futures]
    seconds = time.perf_counter() - start
    hits = [term_target.lower() in output.lower()
            for (source, _, _), output in zip(rows, outputs)
            for term_source, term_target in terms.items() if term_source.lower() in source.lower()]
    report = {"term_accuracy": sum(hits) / len(hits), "terms": len(hits), "seconds": round(seconds, 2),
              "outputs": outputs}
    for to in sorted({to for _, to, _ in rows}):
        pairs = [(o, ref) for (_, t, ref), o in zip(rows, outputs) if t == to]
        tokenize = "zh" if to.startswith("zh") else "13a"
        report[f"chrf_{to}"] = round(sacrebleu.corpus_chrf([o for o, _ in pairs], [[r for _, r in pairs]]).score, 2)
        report[f"bleu_{to}"] = round(sacrebleu.corpus_bleu([o for o, _ in pairs], [[r for _, r in pairs]],
                                                           tokenize=tokenize).score, 2)
    report["chrf"] = round(sacrebleu.corpus_chrf(outputs, [[ref for *_, ref in rows]]).score, 2)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=str(HERE.parent / "models"))
    parser.add_argument("--out", default=str(HERE / "results" / "glossary.json"))
    args = parser.parse_args()
    registry = load_engines(args.models, RuntimeOptions(), BatchingOptions(), only=(MODEL,))
    try:
        engine = registry.get(MODEL)
        terms = glossary.read_file(pathlib.Path(args.models) / MODEL / glossary.FILE)
        rows = sentences()
        without = measure(engine, rows, terms, use_glossary=False)
        with_glossary = measure(engine, rows, terms, use_glossary=True)
    finally:
        registry.close()
    report = {"model": MODEL, "beam_size": engine.info.default_beam_size, "sentences": len(rows),
              "without": without, "with": with_glossary,
              "examples": [{"source": s, "without": a, "with": b}
                           for (s, _, _), a, b in zip(rows, without["outputs"], with_glossary["outputs"])]}
    pathlib.Path(args.out).write_text(json.dumps(report, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    for name in ("without", "with"):
        r = report[name]
        print(f"{name:8} term accuracy {r['term_accuracy']:.2f} ({r['terms']} terms)  chrF {r['chrf']}  "
              f"zh->en chrF {r['chrf_en']}  en->zh chrF {r['chrf_zh-TW']}  {r['seconds']} s")


if __name__ == "__main__":
    main()
