"""Gathers the served-search dev scores of every checkpoint of one or more runs into one file: how a version
was chosen, and, for runs trained side by side from the same weights, an ablation.

    python -m attnserve.export.speech.checkpoint_scores --baseline models/speech-en/8=SCORES.json \\
        --run channels=RUN_A/scores --run clean=RUN_B/scores --chosen channels:12345 --out selection.json

Each scores folder holds `step-<N>.json` files, `speech.evaluate --splits dev dev_channel` run on the
checkpoint of step N (exported with the served search). The run's train.log is not read: the trainer's own
dev figure is greedy and swings from one checkpoint to the next, the served search is what users get.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re

_STEP = re.compile(r"step-(\d+)\.json$")


def split_figures(scores: dict) -> dict:
    return {name: {"cer": s["cer"], "wer": s["wer"], "clips": s["clips"]} for name, s in scores["splits"].items()}


def gather(baseline: tuple[str, pathlib.Path], runs: list[tuple[str, pathlib.Path]], chosen: str | None) -> dict:
    """{"baseline": {name, splits}, "runs": [{name, checkpoints: [{step, splits}]}], "chosen": {run, step}};
    "chosen" is None for an ablation that shipped no checkpoint."""
    name, path = baseline
    out = {"baseline": {"name": name, "splits": split_figures(json.loads(path.read_text()))}, "runs": []}
    for run, folder in runs:
        files = sorted((int(m.group(1)), p) for p in folder.glob("step-*.json") if (m := _STEP.search(p.name)))
        if not files:
            raise ValueError(f"{folder}: no step-<N>.json scores")
        out["runs"].append({"name": run, "checkpoints": [{"step": step, "splits": split_figures(json.loads(p.read_text()))}
                                                         for step, p in files]})
    if chosen is None:
        out["chosen"] = None
        return out
    run, _, step = chosen.partition(":")
    if not any(r["name"] == run and any(c["step"] == int(step) for c in r["checkpoints"]) for r in out["runs"]):
        raise ValueError(f"--chosen {chosen}: no such run and step among the scores")
    out["chosen"] = {"run": run, "step": int(step)}
    return out


def _named(value: str) -> tuple[str, pathlib.Path]:
    name, _, path = value.partition("=")
    if not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {value!r}")
    return name, pathlib.Path(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=_named, required=True, help="NAME=the starting version's scores file")
    parser.add_argument("--run", type=_named, action="append", required=True, help="NAME=a folder of step-<N>.json")
    parser.add_argument("--chosen", help="RUN:STEP, the checkpoint exported (none: an ablation that shipped nothing)")
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args()
    args.out.write_text(json.dumps(gather(args.baseline, args.run, args.chosen), indent=1) + "\n")


if __name__ == "__main__":
    main()
