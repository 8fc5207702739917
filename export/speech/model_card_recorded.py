"""The speech model's card for a version fine-tuned on recorded speech (export/speech/real.py, mix.py).

    python -m attnserve.export.speech.model_card_recorded --checkpoint RUN/best.pt --start-weights V6.pt \\
        --scores /work/data/speech-eval/scores.json --real-stats /work/data/real-speech/stats.json \\
        --mix-stats /work/data/speech-mix/stats.json --model-dir models/speech-en/7 --before models/speech-en/6

`--scores` is `evaluate_real`'s output with both versions and PocketSphinx on the same clips: the card shows
the new version's scores per split and voice, the before -> after table beside PocketSphinx, and examples
with every word's served time span. Training figures come from the checkpoint, minus those of the weights it
started from. `--selection` (export/speech/checkpoint_scores.py) adds every checkpoint's served-search dev
scores, of each run trained side by side, and which one was exported.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch

from attnserve.export.common.model_card import write_card
from attnserve.export.speech import channel
from attnserve.export.speech.model import ListenAttendSpellConfig
from attnserve.export.speech.model_card import closing_lines, ctc_lines, default_search_lines, listener_lines, score_lines

SPHINX = "pocketsphinx"


def comparison_lines(scores: dict, before: str, after: str) -> list[str]:
    lines = [f"| split | clips | hours | {before} CER / WER | {after} CER / WER | PocketSphinx 5 CER / WER |",
             "|---|---|---|---|---|---|"]
    for split, entry in scores["splits"].items():
        cells = [f"{entry[k]['cer']:.1%} / {entry[k]['wer']:.1%}" if k in entry else "-" for k in (before, after, SPHINX)]
        first = entry[after]
        lines.append(f"| {split} | {first['clips']} | {first['hours']:.2f} | " + " | ".join(cells) + " |")
    return lines


def verdict_line(scores: dict, before: str, after: str) -> str:
    """Where the new version's WER is lower or higher than the earlier one's, split by split."""
    better = [s for s, e in scores["splits"].items() if e[after]["wer"] < e[before]["wer"]]
    worse = [s for s, e in scores["splits"].items() if e[after]["wer"] > e[before]["wer"]]
    return (f"Against {before} (WER, the table below): lower on {', '.join(better) or 'nothing'}; higher on"
            f" {', '.join(worse) or 'nothing'}. {before} stays loadable beside it.")


def version_key(scores: dict, model_dir: pathlib.Path) -> str:
    """The key of the new version's figures in `evaluate_real`'s output (which may hold older versions too)."""
    keys = list(next(iter(scores["splits"].values())))
    for key in keys:
        if pathlib.Path(key) == model_dir:
            return key
    raise SystemExit(f"{model_dir} has no scores in --scores (it has {', '.join(keys)})")


def held_out_for_dev(real: dict) -> str:
    """The sources with clips in dev, from real.py's stats (hours per `source/split`)."""
    return ", ".join(key.split("/")[0] for key in real["hours"] if key.split("/")[1] == "dev")


def recorded_data_lines(real: dict, mix: dict) -> list[str]:
    lines = ["| source | split | hours |", "|---|---|---|"]
    lines += [f"| {key.split('/')[0]} | {key.split('/')[1]} | {hours:.2f} |" for key, hours in real["hours"].items()]
    copies = ", ".join(f"{kind} {hours:.2f} h" for kind, hours in mix["train_hours"].items())
    return [*lines, "", f"Training copies (docs/speech-corpus.md) {channel_words(mix)}: {copies}"
                        f" ({mix['train_clips']:,} clips; {mix['real_copies']} per recorded clip,"
                        f" {mix['tts_copies']} per synthesized clip)."]


def channel_words(mix: dict) -> str:
    """How mix.py treated the training copies: no channel, one effect family of a random channel, or all of it."""
    if mix.get("clean"):
        return "without channels (`mix --clean`)"
    if mix.get("effects"):
        return f"through only the {' and '.join(mix['effects'])} part of a random channel (`mix --effects`)"
    return f"through random recording channels ({', '.join(channel.EFFECTS)})"


def selection_lines(selection: dict) -> list[str]:
    """Each run's checkpoints scored with the served search on dev and dev_channel, side by side by order; the
    chosen one in bold (none in an ablation that shipped nothing)."""
    runs, base = selection["runs"], selection["baseline"]
    splits = list(base["splits"])
    cell = lambda f: f"{f['cer']:.1%} / {f['wer']:.1%}"  # noqa: E731
    head = " | ".join(f"{r['name']}: {split}" for r in runs for split in splits)
    lines = [f"| checkpoint | {head} |", "|---|" + "---|" * (len(runs) * len(splits)),
             f"| {base['name']} (the version before) | " + " | ".join(cell(base["splits"][s]) for _ in runs for s in splits) + " |"]
    chosen = selection["chosen"]
    for k in range(max(len(r["checkpoints"]) for r in runs)):
        cells = []
        for r in runs:
            c = r["checkpoints"][k] if k < len(r["checkpoints"]) else None
            mark = "**" if c and chosen and (r["name"], c["step"]) == (chosen["run"], chosen["step"]) else ""
            cells += [f"{mark}{cell(c['splits'][s])}{mark}" if c else "-" for s in splits]
        steps = ", ".join(f"{r['checkpoints'][k]['step']:,}" for r in runs if k < len(r["checkpoints"]))
        lines.append(f"| {k + 1} (steps {steps}) | " + " | ".join(cells) + " |")
    return lines


def render(checkpoint: dict, start: dict, scores: dict, real: dict, mix: dict, model_dir: pathlib.Path,
           before: str, selection: dict | None = None) -> str:
    cfg, state = ListenAttendSpellConfig(**checkpoint["config"]), checkpoint["state"]
    manifest = json.loads((model_dir / "manifest.json").read_text())
    after = version_key(scores, model_dir)
    minutes = (state["seconds"] - start["state"]["seconds"]) / 60
    served = {split: {"beam_size": e[after]["beam_size"], **e[after]} for split, e in scores["splits"].items()}
    own = {"beam_size": next(iter(served.values()))["beam_size"], "splits": served}
    return "\n".join([
        f"# {manifest['name']} (version {manifest['version']})",
        "",
        "An English speech recognizer, listen, attend and spell (Chan et al. 2015), writing lower-case characters,",
        "exported to ONNX with the step's attention as output (docs/model-contract.md), from which the server times",
        f"every word in {10 * cfg.time_reduction} ms spans. Version {manifest['version']} is {before}'s weights trained",
        f"further for {minutes:.0f} minutes on a shared 2-core CPU, on recorded human speech (dev held out:",
        f"{held_out_for_dev(real)}) and synthesized speech, "
        + f"the last run's copies {channel_words(mix)}, with SpecAugment.",
        "It is still far from usable on arbitrary microphones: see the scores.",
        "",
        verdict_line(scores, before, after),
        "",
        *model_section(cfg, checkpoint, manifest),
        *training_section(state, start, before, selection),
        "## Data",
        "",
        "Recorded speech (`python -m attnserve.export.speech.real`); `test_real_heldout` (Drascula, Asterisk) and",
        "`test_microphone` (PocketSphinx's test recordings, where the corpus has them) never train or select the model:",
        "",
        *recorded_data_lines(real, mix),
        "",
        "## Before -> after, beside PocketSphinx 5 (served default search; PocketSphinx's en-us model, same clips)",
        "",
        ("Clips: a subset spread evenly over each split (`<split>.every<k>`: every k-th clip; `evaluate_real --clips`),"
         " the same clips for each column." if any(".every" in split for split in scores["splits"]) else
         "Clips: every clip of each split, the same clips for each column."),
        "",
        *comparison_lines(scores, before, after),
        "",
        f"## Scores of version {manifest['version']}",
        "",
        *score_lines(own),
        "",
        "Word timing is measured where the synthesizer gave word times; the recorded sources give none.",
        "",
        *closing_lines(own, model_dir),
    ])


def model_section(cfg: ListenAttendSpellConfig, checkpoint: dict, manifest: dict) -> list[str]:
    params = sum(v.numel() for v in checkpoint["model"].values())
    return [
        "## Model",
        listener_lines(cfg),
        f"  Speller: one LSTM cell of {cfg.speller_hidden} units with location-aware attention; {cfg.vocab_size}"
        f" output ids; a CTC head on the {cfg.ctc_reduction}x layer; {params / 1e6:.2f}M parameters.",
        f"- Limits: {manifest['input']['max_seconds']:g} s of audio, {manifest['limits']['max_new_tokens']} characters.",
        *ctc_lines(manifest["encoder"].get("ctc", {}).get("weight", 0.0)),
        *default_search_lines(manifest),
        "",
    ]


def training_section(state: dict, start: dict, before: str, selection: dict | None = None) -> list[str]:
    """What this run added to the weights it started from (`start`): steps, audio, compute, the dev history
    (greedy, the trainer's), and with `selection` every checkpoint's served-search dev scores."""
    minutes = (state["seconds"] - start["state"]["seconds"]) / 60
    hours = (state["audio_seconds"] - start["state"]["audio_seconds"]) / 3600
    steps = state["step"] - start["state"]["step"]
    history = [h for h in state["history"] if h["step"] > start["state"]["step"]]
    best = min(history, key=lambda h: h["cer"])
    return [
        "## Training",
        f"- From {before} (step {start['state']['step']:,}): {steps:,} steps, {hours:.1f} h of audio seen in"
        f" {minutes:.0f} minutes of compute ({hours * 3600 / max(minutes * 60, 1):.0f} audio-s/s on 2 CPU"
        " cores shared with other jobs). Joint CTC-attention loss, Adam (fresh), inverse-square-root decay.",
        f"- The trainer's greedy dev CER (its first dev clips: held-out Amazon Queen characters): best {best['cer']:.1%}"
        f" (WER {best['wer']:.1%}) at step {best['step']:,}; history: "
        + ", ".join(f"{h['step']:,}: {h['cer']:.1%}" for h in history) + ".",
        "",
        *([] if selection is None else [
            f"Chosen with the served search (CER / WER) on dev and on dev_channel (the same clips, each through a"
            f" random recording channel), never on a test split: step {selection['chosen']['step']:,} of"
            f" {selection['chosen']['run']} (bold).",
            "",
            *selection_lines(selection),
            "",
        ]),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, what in (("--checkpoint", "the exported checkpoint"), ("--start-weights", "the weights it started from"),
                       ("--scores", "evaluate_real's output"), ("--real-stats", "real.py's stats.json"),
                       ("--mix-stats", "mix.py's stats.json"), ("--model-dir", "the exported version folder")):
        parser.add_argument(flag, type=pathlib.Path, required=True, help=what)
    parser.add_argument("--before", required=True, help="the earlier version's key in --scores")
    parser.add_argument("--selection", type=pathlib.Path, help="checkpoint_scores.py's output")
    parser.add_argument("--out", type=pathlib.Path, help="default: README.md beside the version folders")
    args = parser.parse_args()
    load = lambda p: torch.load(p, map_location="cpu", weights_only=False)  # noqa: E731
    card = render(load(args.checkpoint), load(args.start_weights), json.loads(args.scores.read_text()),
                  json.loads(args.real_stats.read_text()), json.loads(args.mix_stats.read_text()), args.model_dir,
                  args.before, json.loads(args.selection.read_text()) if args.selection else None)
    write_card(args.out or args.model_dir.parent / "README.md", card)


if __name__ == "__main__":
    main()
