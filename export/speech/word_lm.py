"""Builds the speech recognizer's word trigram LM for rescoring its candidates (server/decoding/word_lm.py).

    python -m attnserve.export.speech.word_lm --corpus data/corpus --packages data/text-packages \\
        --manifests data/real-speech/train.jsonl --exclude data/real-speech/*.jsonl --out /tmp/words.npz

Its text, each sentence normalised as the recordings' transcripts are (export/speech/text.py; a sentence with
digits or symbols has no unique transcript and is left out):
- the translation corpus's English, train split (dictionary glosses left out: they are not sentences);
- the transcripts of the given speech manifests (train splits: dialogue, nearer to speech than help texts);
- two Debian packages read without installing them (`apt-get download`, `dpkg-deb -x`): `fortunes`
  (quotations, jokes, conversation) and `wordnet-base` (WordNet's example sentences: "he ate a piece of cake").
Any sentence equal to a transcript of the `--exclude` manifests (dev and test splits) is dropped, so no
clip a score is measured on has its own line in the LM. Reports sentences and words per source and the
LM's perplexity on the excluded transcripts.
"""

from __future__ import annotations

import argparse
import pathlib
import re
from collections.abc import Iterable, Iterator

from attnserve.export.common.reports import emit
from attnserve.export.common.word_ngram_build import build, perplexity
from attnserve.export.speech import manifest, text
from attnserve.export.speech.build import read_corpus
from attnserve.export.speech.real import fetch

PACKAGES = ("fortunes", "wordnet-base")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_QUOTED = re.compile(r'"([^"]+)"')


def sentences(lines: Iterable[str]) -> Iterator[str]:
    """The transcript of every sentence of the lines that has one, two words or more."""
    for line in lines:
        for sentence in _SENTENCE_END.split(line):
            try:
                transcript = text.normalise(sentence.strip())
            except ValueError:
                continue
            if len(transcript.split()) >= 2:
                yield transcript


def fortunes(root: pathlib.Path) -> Iterator[str]:
    """Each fortune cookie as one line, its attribution ("-- Mark Twain") left out."""
    for path in sorted((root / "usr/share/games/fortunes").iterdir()):
        if path.suffix or not path.is_file():  # .dat indexes and .u8 copies
            continue
        for cookie in path.read_text(encoding="latin-1").split("\n%\n"):
            lines = [line for line in cookie.splitlines() if not line.strip().startswith("--")]
            yield " ".join(" ".join(lines).split())


def wordnet_examples(root: pathlib.Path) -> Iterator[str]:
    """The quoted example sentences of WordNet's glosses (after the "|" of each synset's line)."""
    for path in sorted((root / "usr/share/wordnet").glob("data.*")):
        for line in path.read_text(encoding="latin-1").splitlines():
            if "|" in line:
                yield from _QUOTED.findall(line.split("|", 1)[1])


def gather(corpus: pathlib.Path, packages: pathlib.Path, manifests: list[pathlib.Path]) -> dict[str, list[str]]:
    """Source name -> its sentences' transcripts."""
    roots = {name: fetch(packages, name) for name in PACKAGES}
    return {
        "translation_corpus": list(sentences(en for en, source, split in read_corpus(corpus)
                                             if split == "train" and not source.startswith("cedict"))),
        "speech_manifests": [row["text"] for p in manifests for row in manifest.read(p)],
        "fortunes": list(sentences(fortunes(roots["fortunes"]))),
        "wordnet_examples": list(sentences(wordnet_examples(roots["wordnet-base"]))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=pathlib.Path, default=pathlib.Path("data/corpus"),
                        help="the translation corpus (python -m attnserve.export.translation.corpus.build)")
    parser.add_argument("--packages", type=pathlib.Path, default=pathlib.Path("data/text-packages"),
                        help="where the Debian packages are downloaded and unpacked")
    parser.add_argument("--manifests", type=pathlib.Path, nargs="*", default=[],
                        help="speech manifests (train splits only) whose transcripts join the text")
    parser.add_argument("--exclude", type=pathlib.Path, nargs="*", default=[],
                        help="speech manifests (dev, test) whose transcripts must not be in the text")
    parser.add_argument("--order", type=int, default=3)
    parser.add_argument("--out", type=pathlib.Path, required=True, help="the LM file to write (.npz)")
    parser.add_argument("--report", type=pathlib.Path, help="also write the report here")
    args = parser.parse_args()
    held_out = {row["text"] for p in args.exclude for row in manifest.read(p)}
    sources = gather(args.corpus, args.packages, args.manifests)
    kept = {name: [s for s in found if s not in held_out] for name, found in sources.items()}
    model = build((s for found in kept.values() for s in found), args.order)
    model.save(args.out)
    report = {
        "file": str(args.out), "order": model.order, "vocabulary": len(model.ids),
        "ngrams": [len(k) for k in model.keys], "megabytes": round(args.out.stat().st_size / 2**20, 1),
        "sources": {name: {"sentences": len(found), "words": sum(len(s.split()) for s in found),
                           "dropped_as_held_out": len(sources[name]) - len(found)} for name, found in kept.items()},
        "held_out": {f"{p.parent.name}/{p.stem}": perplexity(model, [r["text"] for r in manifest.read(p)])
                     for p in args.exclude},
    }
    emit(report, args.report)


if __name__ == "__main__":
    main()
