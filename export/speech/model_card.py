"""Writes the speech model's card (README.md next to its version folders) from what was measured.

    python -m attnserve.export.speech.model_card --checkpoint RUN/best.pt --scores models/speech-en/scores.json \\
        --corpus-stats data/speech/stats.json --model-dir models/speech-en/1

Data hours per voice come from the corpus builder's stats.json, training time and dev history from the
checkpoint, test scores from `attnserve.export.speech.evaluate`.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch

from attnserve.export.common.model_card import size_table, write_card
from attnserve.export.speech.model import ListenAttendSpellConfig


def data_lines(stats: dict) -> list[str]:
    """Hours of audio per voice and split (espeak-ng's many variants summed, as the stats give them)."""
    splits = stats["splits"]
    voices = sorted({v for s in splits.values() for v in s.get("hours_by_voice", {})})
    lines = ["| voice | " + " | ".join(splits) + " |", "|---|" + "---|" * len(splits)]
    for voice in voices:
        cells = [f"{s['hours_by_voice'][voice]:.2f}" if voice in s.get("hours_by_voice", {}) else "-" for s in splits.values()]
        lines.append(f"| {voice} | " + " | ".join(cells) + " |")
    lines.append("| **total** | " + " | ".join(f"**{s['hours']:.2f}**" for s in splits.values()) + " |")
    return lines


def score_lines(scores: dict) -> list[str]:
    lines = ["| split | clips | hours | CER | WER | word start / end error: median (p90) | boundaries within 100 ms |",
             "|---|---|---|---|---|---|---|"]
    for name, s in scores["splits"].items():
        t = s["word_timing"]
        timing = (f"{t['start_median_s'] * 1000:.0f} ({t['start_p90_s'] * 1000:.0f}) / "
                  f"{t['end_median_s'] * 1000:.0f} ({t['end_p90_s'] * 1000:.0f}) ms | "
                  f"{t['boundaries_within_100ms']:.0%} of {t['words']:,} words") if t["words"] else "no matched words | -"
        lines.append(f"| {name} | {s['clips']} | {s['hours']:.2f} | {s['cer']:.1%} | {s['wer']:.1%} | {timing} |")
    lines += ["", "| split | voice | clips | CER | WER |", "|---|---|---|---|---|"]
    for name, s in scores["splits"].items():
        lines += [f"| {name} | {voice} | {v['clips']} | {v['cer']:.1%} | {v['wer']:.1%} |" for voice, v in s["by_voice"].items()]
    return lines


def comparison_lines(scores: dict, previous: dict | None) -> list[str]:
    """The previous version's scores beside these, split by split (each on its own corpus build's test clips)."""
    if previous is None:
        return []
    same = all(previous["splits"].get(name, {}).get(k) == s[k] for name, s in scores["splits"].items()
               for k in ("clips", "hours"))
    where = ("on the same test clips" if same else "on its own corpus build's test clips: the same voices and the "
             "same held-out rule, other sentences")
    lines = ["", f"Against the previous version ({previous['model']}, beam {previous['beam_size']}, scored {where}):",
             "", "| split | CER before | CER now | WER before | WER now |", "|---|---|---|---|---|"]
    for name, s in scores["splits"].items():
        if name in previous["splits"]:
            p = previous["splits"][name]
            lines.append(f"| {name} | {p['cer']:.1%} | {s['cer']:.1%} | {p['wer']:.1%} | {s['wer']:.1%} |")
    return lines


def example_lines(scores: dict) -> list[str]:
    lines = ["| split | voice | reference | model, with each word's served time span (s) |", "|---|---|---|---|"]
    for name, s in scores["splits"].items():
        for e in s["examples"]:
            timed = " ".join(f"{w} [{a:.2f}-{b:.2f}]" for w, a, b in e["words"])
            lines.append(f"| {name} | {e['voice']} | {e['reference']} | {timed} |")
    return lines


# Above this character or word error rate on some test split, the card opens with a warning.
UNDERTRAINED_CER = 0.5
UNDERTRAINED_WER = 0.5


def status_lines(scores: dict, state: dict, joint: bool = False) -> list[str]:
    """A warning section when the model mishears most of what it is given; none otherwise.

    Args:
        joint: the manifest decodes with the CTC head (encoder.ctc), which keeps the speller out of loops.
    """
    worst = max(s["cer"] for s in scores["splits"].values())
    if worst <= UNDERTRAINED_CER and max(s["wer"] for s in scores["splits"].values()) <= UNDERTRAINED_WER:
        return []
    timing = [s["word_timing"] for s in scores["splits"].values() if s["word_timing"]["words"]]
    medians = sorted(1000 * t["start_median_s"] for t in timing)
    aligned = (f" Its attention aligns: the words it gets right are timed with a median start error of"
               f" {medians[0]:.0f}-{medians[-1]:.0f} ms.") if medians else ""
    wer = max(s["wer"] for s in scores["splits"].values())
    if joint:
        loops = (f"(CER up to {worst:.0%}, WER up to {wer:.0%}): most words come out misspelt, though joint"
                 " CTC/attention decoding (below) keeps the speller from looping")
    elif wer > 1:
        loops = (f"(CER up to {worst:.0%}) and loops on clips longer than a few seconds, whose insertions push WER"
                 " past 100%")
    else:
        loops = (f"(CER up to {worst:.0%}, WER up to {wer:.0%}); on clips longer than a few seconds it tends to"
                 " loop, and the length hint (below) cuts those loops short")
    return [
        "## Status: undertrained",
        "",
        f"This version is the checkpoint after {state['seconds'] / 60:.0f} minutes of CPU training, exported as it"
        f" is. It mishears many words {loops}.{aligned} Train longer (the training"
        " command resumes; `--threads 2` on a quiet machine) before using it for anything but the attention demo.",
        "",
    ]


def length_hint_lines(manifest: dict) -> list[str]:
    """How the served transcript's length is bounded (docs/model-contract.md, encoder.length_hint)."""
    hint = manifest["encoder"].get("length_hint")
    if hint is None:
        return []
    return [
        f"- Each transcript stops after ceil({hint['scale']:g} x n) + {hint['offset']} characters, n being the length of"
        f" the CTC head's best path (`{hint['output']}`, an encoder output), and after"
        f" {manifest['input'].get('max_tokens_per_second', '-')} characters per second of audio: a speller caught in"
        " a loop stops near the clip's length.",
    ]


def default_search_lines(manifest: dict) -> list[str]:
    """The search a request gets when it names none (manifest `decoding`, docs/model-contract.md)."""
    beams = manifest.get("decoding", {}).get("beam_size", 1)
    if beams <= 1:
        return ["- Default search: greedy (requests may ask for beams)."]
    return [f"- Default search: {beams} beams (manifest `decoding.beam_size`; a request's beam_size 1 asks for greedy),"
            " scored below."]


def default_scores_lines(scores: dict | None) -> list[str]:
    """The test scores of the search requests get by default, and how it was chosen (on dev)."""
    if scores is None:
        return []
    chosen = [f"Chosen on {scores['chosen_on']}.", ""] if "chosen_on" in scores else []
    return [f"## Scores with the default search (served, beam {scores['beam_size']}, CTC weight"
            f" {scores.get('ctc_weight', 0):g})", "", *chosen, *score_lines(scores), ""]


def noise_lines(noise: dict | None) -> list[str]:
    """CER / WER with white noise mixed in (evaluate --noise-snr-db): where the recognizer stops working."""
    if noise is None:
        return []
    splits = list(next(iter(noise["runs"].values())))
    lines = [f"## With noise (served, beam {noise['beam_size']}, CTC weight {noise['ctc_weight']:g})", "",
             f"Clips: {noise['clips']}. Noise: {noise['noise']}.", "",
             "| noise | " + " | ".join(f"{s} CER / WER" for s in splits) + " |", "|---|" + "---|" * len(splits)]
    for name, run in noise["runs"].items():
        label = "none" if name == "clean" else name.removeprefix("snr_").replace("_db", " dB SNR")
        lines.append(f"| {label} | " + " | ".join(f"{run[s]['cer']:.1%} / {run[s]['wer']:.1%}" for s in splits) + " |")
    return [*lines, ""]


def ctc_lines(w: float) -> list[str]:
    """How the CTC head takes part in decoding with weight `w` (docs/model-contract.md, encoder.ctc)."""
    if not w:
        return []
    return [f"- Joint CTC/attention decoding: every candidate character is ranked by {1 - w:g} x the speller's"
            f" log-probability + {w:g} x its CTC prefix score (server/decoding/ctc_prefix.py), so the speller cannot loop,"
            " skip or stop early unopposed."]


def listener_lines(cfg: ListenAttendSpellConfig) -> str:
    """The listener's layers as the config builds them (export/speech/model.py)."""
    stack, lower, reduction = cfg.stack_frames, cfg.bottom_layers, cfg.time_reduction
    first = (f"{stack} log-mel frames of 80 bands stacked side by side ({10 * stack} ms per step)" if stack > 1
             else "80 log-mel bands")
    bottoms = f"{lower} BiLSTMs" if lower > 1 else "a BiLSTM"
    return (f"- Listener: {bottoms} ({cfg.listener_hidden} units per direction) over {first}, then"
            f" {cfg.pyramid_layers} pyramid BiLSTM{'s' if cfg.pyramid_layers > 1 else ''} halving time"
            f" ({reduction}x: one attention column per {10 * reduction} ms).")


def render(checkpoint: dict, scores: dict, stats: dict, model_dir: pathlib.Path, previous: dict | None = None,
           ctc_loss_weight: float | None = None, default_scores: dict | None = None, noise: dict | None = None) -> str:
    """The card's text. `ctc_loss_weight`: the training loss's CTC share, for checkpoints that do not record it;
    `default_scores`: the default search's scores, when it is not the one `scores` used; `noise`: scores with
    noise mixed in."""
    cfg, state = ListenAttendSpellConfig(**checkpoint["config"]), checkpoint["state"]
    ctc_share = ctc_loss_weight if ctc_loss_weight is not None else state.get("ctc_weight", 0.3)
    manifest = json.loads((model_dir / "manifest.json").read_text())
    joint_weight = manifest["encoder"].get("ctc", {}).get("weight", 0.0)
    return "\n".join([
        f"# {manifest['name']} (version {manifest['version']})",
        "",
        "An English speech recognizer, listen, attend and spell (Chan et al. 2015), writing lower-case characters.",
        "Exported to ONNX with the speller's h, c, attention context and previous attention as replaced decoder",
        "state and the step's attention as output (docs/model-contract.md): each output character's attention",
        f"over {10 * cfg.time_reduction} ms time spans, from which the server times every word.",
        "Trained from scratch here, on 2 CPU cores, on synthesized speech only: expect it to fail on real voices.",
        "",
        *status_lines(scores, state, joint=bool(joint_weight)),
        *model_section(cfg, checkpoint, manifest, joint_weight),
        *training_section(cfg, state, ctc_share),
        "## Data (hours of audio per voice)",
        "",
        "Synthesized by `python -m attnserve.export.speech.build`; held-out voices never train or select the model.",
        "",
        *data_lines(stats),
        "",
        *default_scores_lines(default_scores),
        *noise_lines(noise),
        f"## Scores (served, beam {scores['beam_size']}, CTC weight {scores.get('ctc_weight', 0):g})",
        "",
        *score_lines(scores),
        *comparison_lines(scores, previous),
        "",
        "Word timing: the server's word timestamps (the monotonic path through each clip's attention,",
        "server/attention/timestamps.py) against the synthesizer's own word times, for every served word that matches a",
        "reference word.",
        "",
        *closing_lines(scores, model_dir),
    ])


def model_section(cfg: ListenAttendSpellConfig, checkpoint: dict, manifest: dict, joint_weight: float) -> list[str]:
    params = sum(v.numel() for k, v in checkpoint["model"].items())
    return [
        "## Model",
        listener_lines(cfg),
        f"  Speller: one LSTM cell of {cfg.speller_hidden} units with location-aware"
        f" attention (additive content score + {cfg.location_filters} convolution filters of width"
        f" {cfg.location_kernel} over the previous step's weights); {cfg.vocab_size} output ids (26 letters, apostrophe, word marker,"
        f" 4 specials); a CTC head on the {cfg.ctc_reduction}x layer; {params / 1e6:.2f}M parameters.",
        f"- Limits: {manifest['input']['max_seconds']:g} s of audio, {manifest['limits']['max_new_tokens']} characters.",
        *length_hint_lines(manifest),
        *ctc_lines(joint_weight),
        *default_search_lines(manifest),
        "",
    ]


def training_section(cfg: ListenAttendSpellConfig, state: dict, ctc_share: float) -> list[str]:
    best, last = min(state["history"], key=lambda h: h["cer"]), state["history"][-1]
    return [
        "## Training",
        f"- {state['step']:,} steps, {state['epoch']} epochs + {state['batch_in_epoch']:,} batches,"
        f" {state['audio_seconds'] / 3600:.1f} h of audio seen in {state['seconds'] / 60:.0f} minutes of compute"
        f" ({state['audio_seconds'] / max(state['seconds'], 1):.0f} audio-s/s on 2 shared CPU cores).",
        f"- Joint CTC-attention loss ({ctc_share:g} CTC on the {cfg.ctc_reduction}x layer + {1 - ctc_share:g} cross-entropy,"
        " label smoothing 0.1), Adam,"
        " warm-up then inverse-square-root decay, mel warp 0.85-1.18 and SpecAugment masks, padded length-sorted"
        f" batches. Seen-voice dev CER (greedy): best {best['cer']:.1%} at step {best['step']:,}, {last['cer']:.1%} at"
        f" step {last['step']:,} (attention loss {last['attention_loss']:.3f}, CTC CER {last['ctc_cer']:.1%})."
        " Script: `python -m attnserve.export.speech.train`.",
        "",
    ]


def closing_lines(scores: dict, model_dir: pathlib.Path) -> list[str]:
    """The card's last sections: examples with their word times, then the files and their sizes."""
    return ["## Examples", "", *example_lines(scores), "", "## Files", "", *size_table(model_dir), ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=pathlib.Path, required=True)
    parser.add_argument("--scores", type=pathlib.Path, required=True, help="output of attnserve.export.speech.evaluate")
    parser.add_argument("--corpus-stats", type=pathlib.Path, default=pathlib.Path("data/speech/stats.json"))
    parser.add_argument("--model-dir", type=pathlib.Path, required=True, help="the exported version folder")
    parser.add_argument("--previous-scores", type=pathlib.Path, help="the previous version's scores, shown beside")
    parser.add_argument("--noise-scores", type=pathlib.Path, help="scores with noise mixed in (one file, by SNR)")
    parser.add_argument("--default-scores", type=pathlib.Path,
                        help="the default search's scores, when --scores used another (e.g. greedy)")
    parser.add_argument("--ctc-loss-weight", type=float,
                        help="the training loss's CTC share, for a checkpoint that does not record it (default 0.3)")
    args = parser.parse_args()
    checkpoint = torch.load(args.checkpoint, map_location="cpu", weights_only=False)
    previous = json.loads(args.previous_scores.read_text()) if args.previous_scores else None
    default = json.loads(args.default_scores.read_text()) if args.default_scores else None
    noise = json.loads(args.noise_scores.read_text()) if args.noise_scores else None
    card = render(checkpoint, json.loads(args.scores.read_text()), json.loads(args.corpus_stats.read_text()),
                  args.model_dir, previous, args.ctc_loss_weight, default, noise)
    write_card(args.model_dir.parent / "README.md", card)


if __name__ == "__main__":
    main()
