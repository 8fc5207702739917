"""What hotwords do for a speech model: each source's rare words given as the hotwords of its clips, as a
speaker would give a talk's names and terms, at several boosts.

    python -m attnserve.export.speech.hotword_eval --model-dir models/speech-en/12 --corpus data/speech-sky2 \\
        --splits dev dev_channel --boosts 0 1 2 3 --out models/speech-en/hotwords-v12.json

A source's list: the words of its clips' references seen at most once in the training transcripts, the
longest 100 of them (the request limit). Every clip of the source is sent with the whole list, so most of
its hotwords are not in any given clip. Reported per boost (0 = no hotwords): WER; recall, the share of
the references' hotword occurrences the output gets right; and false hotwords, hotwords written where the
reference has another word or none, per 100 reference words.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import pathlib

from attnserve.export.common.serving import open_engine
from attnserve.export.speech import manifest
from attnserve.export.speech.confidence import right_words
from attnserve.export.speech.scoring import error_rate
from attnserve.server.decoding.hotwords import MAX_HOTWORDS
from attnserve.export.common.reports import emit


def hotword_lists(rows: list[dict], seen: collections.Counter) -> dict[str, tuple[str, ...]]:
    """Per source: its references' words seen at most once in training, the longest MAX_HOTWORDS."""
    out = {}
    for source in sorted({r["source"] for r in rows}):
        words = dict.fromkeys(w for r in rows if r["source"] == source for w in r["text"].split() if seen[w] <= 1)
        out[source] = tuple(sorted(words, key=lambda w: (-len(w), w))[:MAX_HOTWORDS])
    return out


def hotword_scores(hypotheses: list[str], rows: list[dict], lists: dict[str, tuple[str, ...]]) -> dict:
    """Recall of the references' hotwords and false hotwords per 100 reference words."""
    said = heard = false = 0
    for hypothesis, row in zip(hypotheses, rows, strict=True):
        listed, hyp, ref = set(lists[row["source"]]), hypothesis.split(), row["text"].split()
        said += sum(w in listed for w in ref)
        heard += sum(ok and w in listed for w, ok in zip(ref, right_words(ref, hyp)))
        false += sum(not ok and w in listed for w, ok in zip(hyp, right_words(hyp, ref)))
    words = sum(len(r["text"].split()) for r in rows)
    return {"hotword_occurrences": said, "recall": round(heard / max(said, 1), 3),
            "false_per_100_words": round(100 * false / max(words, 1), 2)}


def main() -> None:
    from attnserve.export.speech.evaluate import transcribe

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=pathlib.Path, required=True)
    parser.add_argument("--corpus", type=pathlib.Path, required=True)
    parser.add_argument("--splits", nargs="+", required=True)
    parser.add_argument("--train-split", default="train", help="the transcripts a word counts as seen in")
    parser.add_argument("--boosts", type=float, nargs="+", default=[0.0, 1.0, 2.0, 3.0])
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    seen = collections.Counter(w for r in manifest.read(args.corpus / f"{args.train_split}.jsonl") for w in r["text"].split())
    engine = open_engine(args.model_dir)
    report = {"model": str(args.model_dir), "splits": {}}
    try:
        for split in args.splits:
            rows = manifest.read(args.corpus / f"{split}.jsonl")
            lists = hotword_lists(rows, seen)
            scores = {}
            for boost in args.boosts:
                def decoding(options, row):
                    if boost == 0:
                        return options
                    return dataclasses.replace(options, hotwords=lists[row["source"]], hotword_boost=boost)
                results = transcribe(engine, args.corpus, rows, 0, attention=False, decoding=decoding)
                hypotheses = [r.text for r in results]
                scores[str(boost)] = {"wer": round(error_rate(hypotheses, [r["text"] for r in rows], "word"), 4),
                                      **hotword_scores(hypotheses, rows, lists)}
                print(split, boost, scores[str(boost)], flush=True)
            report["splits"][split] = {"hotwords": {s: len(v) for s, v in lists.items()}, "by_boost": scores}
    finally:
        engine.close()
    emit(report, args.out)


if __name__ == "__main__":
    main()
