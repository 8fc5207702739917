"""What hotwords cost: the same clips through the served recognizer without hotwords and with their source's
list (export/speech/hotword_eval.py: its rare words, the longest 100), alternating in one run, as audio
seconds transcribed per second (and WER, hotword recall beside).

    python bench/hotwords.py --corpus /work/data/speech-sky2 --split dev --clips 120 \\
        --out bench/results/hotwords.json

One engine (the newest speech-en of --models, its default search). Each round submits every clip (shortest
first, at most 40 in flight) without hotwords and then with them; rounds alternate which goes first. The
ratio is the throughput with hotwords over the throughput without.
"""

from __future__ import annotations

import collections
import functools

from attnserve.api.generation import DecodingOptions
from attnserve.export.common.reports import emit
from attnserve.export.common.serving import open_engine
from attnserve.export.speech import manifest
from attnserve.export.speech.hotword_eval import hotword_lists, hotword_scores
from attnserve.export.speech.scoring import error_rate
from attnserve.server.model.repository import find_models
from speed_readings import NAME, alternate, clip_arguments, first_clips, transcribe  # bench/, the script's own folder


def main() -> None:
    parser = clip_arguments(__doc__)
    parser.add_argument("--train-split", default="train", help="the transcripts a word counts as seen in")
    args = parser.parse_args()

    every = manifest.read(args.corpus / f"{args.split}.jsonl")
    training = manifest.read(args.corpus / f"{args.train_split}.jsonl")
    seen = collections.Counter(w for r in training for w in r["text"].split())
    lists = hotword_lists(every, seen)
    rows, wavs = first_clips(args, every)
    arms = {"without": [DecodingOptions()] * len(rows),
            "with hotwords": [DecodingOptions(hotwords=lists[r["source"]]) for r in rows]}
    engine = open_engine(find_models(args.models, only=[NAME])[NAME].path)
    try:
        texts, seconds = alternate({n: functools.partial(transcribe, engine, wavs, o) for n, o in arms.items()},
                                   args.rounds)
    finally:
        engine.close()
    audio_seconds = sum(r["duration"] for r in rows)
    rates = {name: round(audio_seconds * args.rounds / sum(s), 2) for name, s in seconds.items()}
    report = {
        "clips": len(rows), "audio_seconds": round(audio_seconds, 1), "rounds": args.rounds,
        "hotwords_per_clip": round(sum(len(o.hotwords) for o in arms["with hotwords"]) / len(rows), 1),
        "seconds": seconds, "audio_seconds_per_second": rates,
        "throughput_ratio": round(rates["with hotwords"] / rates["without"], 3),
        "wer": {n: round(error_rate(t, [r["text"] for r in rows], "word"), 4) for n, t in texts.items()},
        "hotwords": {n: hotword_scores(t, rows, lists) for n, t in texts.items()},
    }
    emit(report, args.out)


if __name__ == "__main__":
    main()
