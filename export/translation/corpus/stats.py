"""Figures written to stats.json: counts per source and split, length percentiles."""

from __future__ import annotations

from collections import Counter, defaultdict

from . import Pair

PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99, 100)


def percentiles(values: list[int]) -> dict[str, int]:
    """Nearest-rank percentiles (no interpolation, so every value is a real length)."""
    if not values:
        return {}
    ordered = sorted(values)
    last = len(ordered) - 1
    return {f"p{p}": ordered[min(last, max(0, -(-p * len(ordered) // 100) - 1))] for p in PERCENTILES}


def length_stats(pairs: list[Pair]) -> dict:
    return {
        "en_chars": percentiles([len(p.en) for p in pairs]),
        "zh_chars": percentiles([len(p.zh) for p in pairs]),
    }


def split_stats(splits: dict[str, list[Pair]]) -> dict:
    out = {}
    for name, pairs in splits.items():
        out[name] = {
            "pairs": len(pairs),
            "unique_en": len({p.en for p in pairs}),
            "by_family": dict(sorted(Counter(p.family for p in pairs).items())),
            "lengths": length_stats(pairs),
        }
    return out


def source_table(raw: Counter, cleaned: Counter, kept: Counter, rejected: dict[str, Counter]) -> dict:
    """Per-source counts: raw extracted, passing the filters, left after deduplication."""
    table = {}
    for source in sorted(raw):
        table[source] = {
            "raw": raw[source],
            "cleaned": cleaned[source],
            "after_dedup": kept[source],
            "rejected": dict(sorted(rejected.get(source, Counter()).items())),
        }
    return table


def family_totals(table: dict) -> dict:
    totals: dict[str, Counter] = defaultdict(Counter)
    for source, row in table.items():
        family = source.split("/", 1)[0]
        for key in ("raw", "cleaned", "after_dedup"):
            totals[family][key] += row[key]
    return {family: dict(counts) for family, counts in sorted(totals.items())}
