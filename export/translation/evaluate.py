"""Scores a checkpoint on a corpus split in both directions: BLEU and chrF (sacrebleu; Chinese tokenisation
for zh-TW targets), plus example translations.

    python -m attnserve.export.translation.evaluate --checkpoint RUN/best.pt --split data/corpus/test.tsv --out scores.json
"""

from __future__ import annotations

import argparse
import pathlib
import time

import sacrebleu
import torch

from attnserve.export.translation import bpe, train
from attnserve.export.translation.architectures import load_checkpoint
from attnserve.export.translation.train import read_pairs
from attnserve.export.common.reports import emit

# Corpus families by domain, in the order reports list them: everyday sentences, dictionary entries (CC-CEDICT
# headwords and their glosses), story text (a game's dialogue and descriptions), and every other family,
# software text (UI strings, help pages, manuals).
DOMAIN_FAMILIES = {"everyday": ("hsk", "tatoeba"), "dictionary": ("cedict",), "story": ("wesnoth",), "software": ()}
DIRECTIONS = {"zh-TW->en": (1, 0, "en"), "en->zh-TW": (0, 1, "zh-TW")}  # (source column, target column, lang)


def translate(model, tokenizer, texts: list[str], target: str, batch_size: int = 32, max_new: int = 128) -> list[str]:
    """Greedy translations in input order, batched by source length."""
    start = bpe.language_token_ids(tokenizer)[target]
    encoded = [e.ids[: model.cfg.max_positions // 2 - 1] + [bpe.EOS_ID] for e in tokenizer.encode_batch(texts)]
    order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
    results = [""] * len(texts)
    for begin in range(0, len(order), batch_size):
        rows = order[begin : begin + batch_size]
        width = max(len(encoded[i]) for i in rows)
        ids = torch.full((len(rows), width), bpe.PAD_ID)
        for r, i in enumerate(rows):
            ids[r, : len(encoded[i])] = torch.tensor(encoded[i])
        outputs, _ = model.greedy_decode(
            ids, (ids != bpe.PAD_ID).long(), torch.full((len(rows),), start), bpe.EOS_ID, max_new,
            suppress_ids=bpe.suppressed_ids(tokenizer),
        )
        for r, i in enumerate(rows):
            results[i] = tokenizer.decode(outputs[r])
    return results


def translate_served(
    repository: pathlib.Path, name: str, texts: list[str], target: str, max_new: int = 128, beam_size: int = 1,
    variant: str | None = None,
) -> list[str]:
    """The same translations through the serving engine (ONNX Runtime, dynamic batching), in input order."""
    engine = open_engine(repository, name, variant)
    try:
        return translate_with(engine, texts, target, max_new, beam_size)
    finally:
        engine.close()


def open_engine(repository: pathlib.Path, name: str, variant: str | None = None):
    """One served model of a repository, as `attnserve serve [--variant]` runs it (only that model is loaded)."""
    from attnserve.server.engine.registry import open_model
    from attnserve.server.model.runtime import RuntimeOptions

    return open_model(repository, name, RuntimeOptions(variant=variant))


def translate_with(engine, texts: list[str], target: str, max_new: int = 128, beam_size: int = 1,
                   reverse_weight: float = 0.0) -> list[str]:
    """Translations by an open engine, in input order (`reverse_weight`: DecodingOptions.reverse_weight)."""
    from attnserve.api.generation import DecodingOptions, GenerationRequest

    name, results = engine.manifest.name, []
    options = DecodingOptions(max_new, beam_size, reverse_weight=reverse_weight)
    for begin in range(0, len(texts), 128):  # stay under the batcher's queue bound
        futures = [
            engine.submit(GenerationRequest(name, text, target, options))
            for text in texts[begin : begin + 128]
        ]
        results += [f.result().text for f in futures]
    return results


def score(hypotheses: list[str], references: list[str], target: str) -> dict:
    tokenize = "zh" if target == "zh-TW" else "13a"
    bleu_metric, chrf_metric = sacrebleu.metrics.BLEU(tokenize=tokenize), sacrebleu.metrics.CHRF()
    bleu = bleu_metric.corpus_score(hypotheses, [references])
    chrf = chrf_metric.corpus_score(hypotheses, [references])
    return {
        "bleu": round(bleu.score, 2),
        "chrf": round(chrf.score, 2),
        "signatures": [str(bleu_metric.get_signature()), str(chrf_metric.get_signature())],
    }


def read_families(split: pathlib.Path, count: int) -> list[str]:
    """Each pair's source family (`hsk`, `gettext`, ...) from the corpus's line-aligned .source file."""
    path = split.with_suffix(".source")
    if not path.exists():
        return ["all"] * count
    return train.read_families(path)[:count]


def domain_rows(families: list[str]) -> dict[str, list[int]]:
    """The pairs' indices by domain (DOMAIN_FAMILIES); a family named in no domain is software text."""
    domain_of = {family: domain for domain, named in DOMAIN_FAMILIES.items() for family in named}
    rows: dict[str, list[int]] = {domain: [] for domain in DOMAIN_FAMILIES}
    for i, family in enumerate(families):
        rows[domain_of.get(family, "software")].append(i)
    return rows


def by_group(hypotheses: list[str], references: list[str], groups: dict[str, list[int]], target: str) -> dict:
    """Scores per group of pair indices (families, or domains from `domain_rows`), for the groups with pairs."""
    return {
        group: {"pairs": len(rows), **score([hypotheses[i] for i in rows], [references[i] for i in rows], target)}
        for group, rows in groups.items()
        if rows
    }


def spread(indices: list[int], n: int) -> list[int]:
    step = max(len(indices) // max(n, 1), 1)
    return indices[::step][:n]


def evaluate(
    checkpoint: pathlib.Path, split: pathlib.Path, limit: int, examples: int, served=None, beam_size: int = 1,
    variant: str | None = None,
) -> dict:
    """Scores the checkpoint; with `served` = (repository, model name), also the exported model as served,
    greedy and, when `beam_size` > 1, with beam search."""
    model, tokenizer = load_checkpoint(checkpoint)
    pairs = read_pairs(split)[:limit] if limit else read_pairs(split)
    families = read_families(split, len(pairs))
    report = {"checkpoint": str(checkpoint), "split": str(split), "pairs": len(pairs), "directions": {}}
    domains = domain_rows(families)
    family_rows = {family: [i for i, f in enumerate(families) if f == family] for family in sorted(set(families))}
    everyday, software = domains["everyday"], domains["software"]
    # Half the examples from everyday sentences, half from the software text that dominates.
    shown = sorted(spread(everyday, examples // 2) + spread(software, examples - min(len(everyday), examples // 2)))
    for name, (src_col, tgt_col, target) in DIRECTIONS.items():
        started = time.perf_counter()
        sources = [p[src_col] for p in pairs]
        references = [p[tgt_col] for p in pairs]
        hypotheses = translate(model, tokenizer, sources, target)
        result = score(hypotheses, references, target)
        result["seconds"] = round(time.perf_counter() - started, 1)
        result["by_family"] = by_group(hypotheses, references, family_rows, target)
        result["by_domain"] = by_group(hypotheses, references, domains, target)
        result["examples"] = [
            {"family": families[i], "source": sources[i], "reference": references[i], "hypothesis": hypotheses[i]}
            for i in shown
        ]
        if served:
            # Same weights, ONNX Runtime + batching: outputs should be identical to PyTorch's.
            served_hypotheses = translate_served(*served, sources, target)
            result["served"] = score(served_hypotheses, references, target)
            result["served"]["identical_to_pytorch"] = sum(a == b for a, b in zip(served_hypotheses, hypotheses))
            if variant:
                # Quantized graphs: not identical, so scored side by side with the float32 ones.
                started = time.perf_counter()
                variant_hypotheses = translate_served(*served, sources, target, variant=variant)
                result["served_variant"] = {"variant": variant, **score(variant_hypotheses, references, target),
                                            "identical_to_default": sum(
                                                a == b for a, b in zip(variant_hypotheses, served_hypotheses)),
                                            "seconds": round(time.perf_counter() - started, 1)}
            if beam_size > 1:
                beams = translate_served(*served, sources, target, beam_size=beam_size)
                result["served_beam"] = {"beam_size": beam_size, **score(beams, references, target),
                                         "by_domain": by_group(beams, references, domains, target)}
        report["directions"][name] = result
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=pathlib.Path, required=True)
    parser.add_argument("--split", type=pathlib.Path, default=pathlib.Path("data/corpus/test.tsv"))
    parser.add_argument("--limit", type=int, default=0, help="score only the first N pairs (0 = all)")
    parser.add_argument("--examples", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--served-models", type=pathlib.Path, help="also score this repository's exported model")
    parser.add_argument("--served-name", default="translate-zh-en")
    parser.add_argument("--served-beam-size", type=int, default=1, help="also score served beam search")
    parser.add_argument("--served-variant", help="also score this manifest variant's graphs (e.g. int8)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    served = (args.served_models, args.served_name) if args.served_models else None
    report = evaluate(args.checkpoint, args.split, args.limit, args.examples, served, args.served_beam_size,
                      args.served_variant)
    emit(report, args.out, ensure_ascii=False)


if __name__ == "__main__":
    main()
