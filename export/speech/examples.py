"""Copies a few held-out-voice clips next to the bundled speech model, for the README, the CLI and its tests.

    python -m attnserve.export.speech.examples --corpus data/speech --out models/speech-en/examples

Chosen by rule, not by how well the model does: per held-out voice, the first clips of the split (in
corpus order) that last 2-5 s and whose synthesizer word times are exact. `examples.json` keeps each
clip's text, voice and word times.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil

from attnserve.export.speech.evaluate import voice_group

SPLIT = "test_heldout_voices"


def pick(rows: list[dict], per_voice: int) -> list[dict]:
    chosen: dict[str, list[dict]] = {}
    for row in rows:
        fits = 2.0 <= row["duration"] <= 5.0 and not row["inexact_words"]
        voice = chosen.setdefault(voice_group(row), [])
        if fits and len(voice) < per_voice:
            voice.append(row)
    return [row for voice in chosen.values() for row in voice]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=pathlib.Path, default=pathlib.Path("data/speech"))
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("models/speech-en/examples"))
    parser.add_argument("--per-voice", type=int, default=2)
    args = parser.parse_args()
    rows = [json.loads(line) for line in (args.corpus / f"{SPLIT}.jsonl").read_text().splitlines() if line.strip()]
    args.out.mkdir(parents=True, exist_ok=True)
    examples = []
    for row in pick(rows, args.per_voice):
        name = f"{voice_group(row).replace(':', '-')}-{row['id'].rsplit('_', 1)[1]}.wav"
        shutil.copyfile(args.corpus / row["path"], args.out / name)
        examples.append({"file": name, "text": row["text"], "engine": row["engine"], "voice": row["voice"],
                         "duration": row["duration"], "words": row["words"]})
    lines = ",\n".join(" " + json.dumps(e) for e in examples)  # one clip per line
    (args.out / "examples.json").write_text(f"[\n{lines}\n]\n")
    print(f"wrote {len(examples)} clips to {args.out}")


if __name__ == "__main__":
    main()
