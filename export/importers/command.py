"""`attnserve import CHECKPOINT_DIR --name NAME --repository DIR`: a transformers checkpoint folder -> a
version folder of a model repository (docs/import.md).

    attnserve import ~/opus-mt-zh-en --name opus-mt-zh-en --repository models [--variant int8]

The flags are defined without importing torch (the serving install has none); `run` imports the family's
importer, writes `DIR/NAME/VERSION/` (graphs, tokenizers, manifest.json), an int8 or fp16 variant when asked,
and a model card stub, `DIR/NAME/README.md`, recording where the model came from: the checkpoint's file hashes
and the transformers and torch versions that converted it.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys

VARIANTS = ("fp32", "int8", "fp16")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", metavar="CHECKPOINT_DIR", type=pathlib.Path,
                        help="a local transformers checkpoint folder (config.json, weights, tokenizer files)")
    parser.add_argument("--name", required=True, help="the model's name in the repository")
    parser.add_argument("--repository", required=True, type=pathlib.Path, help="the model repository folder")
    parser.add_argument("--version", type=int, help="version number (default: one above the highest there)")
    parser.add_argument("--languages", nargs="+", metavar="CODE",
                        help="language codes where the checkpoint names none (Marian: SOURCE TARGET)")
    parser.add_argument("--variant", choices=VARIANTS, default="fp32",
                        help="also write this variant beside the float32 graphs (default: %(default)s only)")


def run(args: argparse.Namespace) -> int:
    """The command: returns 0, or prints the refusal and returns 1."""
    try:
        out_dir = import_checkpoint(args.checkpoint, args.repository, args.name, args.version, args.languages,
                                    args.variant)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"imported {args.checkpoint} as {args.name} version {out_dir.name} into {out_dir}")
    return 0


def import_checkpoint(checkpoint: pathlib.Path, repository: pathlib.Path, name: str, version: int | None = None,
                      languages: list[str] | None = None, variant: str = "fp32") -> pathlib.Path:
    """Imports one checkpoint; returns its version folder. A failed import leaves no folder behind.

    Raises:
        ValueError: an unsupported architecture, config key or value, or a missing file (named).
    """
    from attnserve.export.importers import model_card
    from attnserve.export.importers.checkpoint import Checkpoint

    ckpt = Checkpoint(checkpoint)
    family = _family(ckpt.architecture, ckpt.folder)
    version = version if version is not None else _next_version(repository / name)
    out_dir = repository / name / str(version)
    if out_dir.exists():
        raise ValueError(f"{out_dir} exists already: choose another --version")
    out_dir.mkdir(parents=True)
    try:
        manifest = family.import_checkpoint(ckpt, out_dir, name, version, languages)
        if variant != "fp32":
            from attnserve.export.common.quantize import quantize_folder

            quantize_folder(out_dir, variant)
        model_card.write(repository / name, ckpt, manifest, variant)
    except BaseException:
        shutil.rmtree(out_dir, ignore_errors=True)
        raise
    return out_dir


def _family(architecture: str, folder: pathlib.Path):
    from attnserve.export.importers import m2m100, marian, mbart, vision_encoder_decoder, whisper

    families = {marian.ARCHITECTURE: marian, m2m100.ARCHITECTURE: m2m100, mbart.ARCHITECTURE: mbart,
                vision_encoder_decoder.ARCHITECTURE: vision_encoder_decoder, whisper.ARCHITECTURE: whisper}
    if architecture not in families:
        raise ValueError(f"{folder}: architecture {architecture} is not supported; the importer reads "
                         f"{', '.join(sorted(families))}")
    return families[architecture]


def _next_version(model_dir: pathlib.Path) -> int:
    versions = [int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()] if model_dir.is_dir() else []
    return max(versions, default=0) + 1
