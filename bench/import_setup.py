"""What the import benchmarks share: a checkpoint built, imported and converted to CTranslate2 once (kept
under --work), and a process's peak resident memory. Standard library only at import time, so a measured
child process that imports it loads nothing else."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable


def import_and_convert(work: pathlib.Path, name: str,
                       build: Callable[[pathlib.Path], object]) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path, dict]:
    """`build(checkpoint folder)` once, `attnserve import` it as `name` version 1, convert it with
    CTranslate2's TransformersConverter; each step skipped when its output exists. Returns the checkpoint,
    repository and CTranslate2 folders and the seconds the steps that ran took."""
    checkpoint, repo, ct2 = work / "checkpoint", work / "repository", work / "ctranslate2"
    times = {}
    if not (checkpoint / "model.safetensors").is_file():
        build(checkpoint)
    if not (repo / name / "1" / "manifest.json").is_file():
        from attnserve.export.importers.command import import_checkpoint

        started = time.perf_counter()
        import_checkpoint(checkpoint, repo, name, 1)
        times["import_s"] = time.perf_counter() - started
    if not (ct2 / "model.bin").is_file():
        from ctranslate2.converters import TransformersConverter

        started = time.perf_counter()
        TransformersConverter(str(checkpoint)).convert(str(ct2), force=True)
        times["ctranslate2_convert_s"] = time.perf_counter() - started
    return checkpoint, repo, ct2, times


def peak_rss_mb(pid: int | str = "self") -> float:
    """A process's peak resident memory in MB (VmHWM: per address space, so a child's own after exec)."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")
