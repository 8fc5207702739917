"""Packs what a borrowed GPU machine needs for training, and shrinks what it sends back.

The machine (export/common/gpu_training.sh) has PyTorch but no internet, and a remote call carries at most about
60 MB and returns files of at most 16 MiB. So the workstation packs a wheel of this package and the
training data into `.gpu/` (git-ignored), and the machine returns float16 weights-only checkpoints, which
`load_checkpoint` (architectures.py) reads back as float32.

    python -m attnserve.export.common.gpu_upload wheel
    python -m attnserve.export.common.gpu_upload translation --corpus data/corpus --tokenizer T.json -- --batch-tokens 12000
    python -m attnserve.export.common.gpu_upload shrink /tmp/gpu-runs /tmp/gpu-runs/results      # on the GPU machine
    python -m attnserve.export.common.gpu_upload unpack /work/.device/.../results.tar.part* --out runs/gpu
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import subprocess
import sys
import tarfile

UPLOAD = pathlib.Path(".gpu")
# Run folder -> the checkpoints worth bringing back, best first (the rest would not fit the return limit).
RETURNED = {"translation": ("averaged.pt", "best.pt"), "speech": ("last.pt",)}


def build_wheel(out: pathlib.Path) -> pathlib.Path:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("attnserve-*.whl"):
        old.unlink()
    shutil.rmtree("build", ignore_errors=True)  # setuptools would reuse stale modules from an earlier build
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), "."],
        check=True,
    )
    return next(out.glob("attnserve-*.whl"))


def pack_translation(corpus: pathlib.Path, tokenizer: pathlib.Path, train_args: list[str]) -> pathlib.Path:
    """The splits the trainer reads (test stays home: it never takes part in training) and the vocabulary."""
    target = UPLOAD / "translation"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    with tarfile.open(target / "corpus.tar.gz", "w:gz") as archive:  # a third of the size: uploads are small
        for name in ("train.tsv", "train.source", "dev.tsv", "dev.source"):
            archive.add(corpus / name, arcname=f"corpus/{name}")
    shutil.copy(tokenizer, target / "tokenizer.json")
    (target / "train-args").write_text(" ".join(train_args) + "\n")
    return target


def shrink(runs: pathlib.Path, out: pathlib.Path) -> list[pathlib.Path]:
    """Float16, weights-only copies of the checkpoints in RETURNED (optimizer state and RNG dropped)."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for run, names in RETURNED.items():
        for name in names:
            path = runs / run / name
            if not path.exists():
                continue
            ckpt = torch.load(path, map_location="cpu", weights_only=False)
            kept = {k: v for k, v in ckpt.items() if k not in ("optimizer", "rng", "model")}
            kept["model"] = {k: v.half() if v.is_floating_point() else v for k, v in ckpt["model"].items()}
            target = out / f"{run}-{name}"
            torch.save(kept, target)
            written.append(target)
            print(f"{target}: {target.stat().st_size / 2**20:.1f} MiB (step {ckpt['state'].get('step')})")
    return written


def unpack(parts: list[pathlib.Path], out: pathlib.Path) -> None:
    """Joins the returned archive parts (in name order) and extracts them into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    joined = out / "results.tar"
    with joined.open("wb") as sink:
        for part in sorted(parts):
            sink.write(part.read_bytes())
    with tarfile.open(joined) as archive:
        archive.extractall(out, filter="data")
    joined.unlink()
    for path in sorted(out.iterdir()):
        print(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("wheel", help="build this package's wheel into .gpu/wheels")
    translation = commands.add_parser("translation", help="pack the translation corpus and vocabulary")
    translation.add_argument("--corpus", type=pathlib.Path, default=pathlib.Path("data/corpus"))
    translation.add_argument("--tokenizer", type=pathlib.Path, required=True)
    translation.add_argument("train_args", nargs="*", help="extra arguments for attnserve.export.translation.train")
    shrinking = commands.add_parser("shrink", help="(GPU machine) float16 weights-only copies of the results")
    shrinking.add_argument("runs", type=pathlib.Path)
    shrinking.add_argument("out", type=pathlib.Path)
    unpacking = commands.add_parser("unpack", help="join and extract the returned parts")
    unpacking.add_argument("parts", type=pathlib.Path, nargs="+")
    unpacking.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args()
    if args.command == "wheel":
        print(build_wheel(UPLOAD / "wheels"))
    elif args.command == "translation":
        print(pack_translation(args.corpus, args.tokenizer, args.train_args))
    elif args.command == "shrink":
        shrink(args.runs, args.out)
    else:
        unpack(args.parts, args.out)


if __name__ == "__main__":
    main()
