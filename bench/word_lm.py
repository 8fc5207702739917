"""What the word LM costs: the same clips through the served recognizer with and without its manifest's
`word_language_model`, alternating in one run, as audio seconds transcribed per second (and WER beside).

    python bench/word_lm.py --corpus /work/data/real-speech --split dev --clips 120 --out bench/results/word_lm.json

Both engines are the newest speech-en of --models, one with the word LM left out of its manifest (a
temporary copy, graphs linked). With the LM every reading returns all its beams' candidates, each is
scored by the LM, and a winner that is not its reading's best is forced through the model once more. The
ratio is the throughput with the LM over the throughput without.
"""

from __future__ import annotations


from attnserve.export.common.reports import emit
from attnserve.export.speech import manifest
from attnserve.export.speech.evaluate import decoding_variant
from attnserve.export.speech.scoring import error_rate
from attnserve.server.model.manifest import load_manifest
from attnserve.server.model.repository import find_models
from speed_readings import NAME, clip_arguments, first_clips, race  # bench/, the script's own folder


def main() -> None:
    args = clip_arguments(__doc__).parse_args()
    rows, wavs = first_clips(args, manifest.read(args.corpus / f"{args.split}.jsonl"))
    newest = find_models(args.models, only=[NAME])[NAME].path
    if load_manifest(newest / "manifest.json").word_language_model is None:
        raise SystemExit(f"{newest} names no word_language_model")
    with decoding_variant(newest, None, True, word_lm=False) as plain_dir:
        texts, seconds = race({"without word LM": plain_dir, "with word LM": newest}, wavs, args.rounds)
    audio_seconds = sum(r["duration"] for r in rows)
    rates = {name: round(audio_seconds * args.rounds / sum(s), 2) for name, s in seconds.items()}
    report = {
        "model": str(newest), "split": args.split, "clips": len(rows), "audio_seconds": round(audio_seconds, 1),
        "rounds": args.rounds, "seconds": seconds, "audio_seconds_per_second": rates,
        "throughput_ratio": round(rates["with word LM"] / rates["without word LM"], 3),
        "wer": {n: round(error_rate(t, [r["text"] for r in rows], "word"), 4) for n, t in texts.items()},
    }
    emit(report, args.out)


if __name__ == "__main__":
    main()
