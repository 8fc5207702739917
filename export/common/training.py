"""What every family's training run shares: the warm-up schedule, when to checkpoint and stop, and the
checkpoint format.

A checkpoint holds the weights, the optimizer, the model's family (`arch`, the model class's `ARCH`) and
config, the tokenizer JSON, the run's state and the RNG state; any family's checkpoint is rebuilt from its
`arch` by a table of the families a reader knows (translation/architectures.py holds the translators').
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import time
from collections.abc import Callable, Mapping

import torch
from tokenizers import Tokenizer

# arch -> (model class, config class), the table a reader of checkpoints passes in.
Architectures = Mapping[str, tuple[type[torch.nn.Module], type]]


def inverse_sqrt(step: int, opts) -> float:
    """Linear warm-up to `opts.lr` over `opts.warmup_steps`, then inverse-square-root decay (Vaswani et al.)."""
    step = max(step, 1)
    return opts.lr * min(step / opts.warmup_steps, math.sqrt(opts.warmup_steps / step))


class RunClock:
    """When a run checkpoints and ends: every `checkpoint_minutes`, at its deadline, or at once when the run
    folder holds a STOP file (`touch RUN/STOP`: checkpoint now and end, without losing work)."""

    def __init__(self, run: pathlib.Path, minutes: float, checkpoint_minutes: float):
        self.run, self.checkpoint_minutes = run, checkpoint_minutes
        self.deadline = time.monotonic() + minutes * 60
        self.next_checkpoint = time.monotonic() + checkpoint_minutes * 60

    def running(self) -> bool:
        return time.monotonic() < self.deadline

    def after_step(self, checkpoint: Callable[[], None]) -> bool:
        """Calls `checkpoint` when one is due; True when the run must end now (the STOP file is removed)."""
        stop = (self.run / "STOP").exists()
        if stop or time.monotonic() >= self.next_checkpoint or time.monotonic() >= self.deadline:
            checkpoint()
            self.next_checkpoint = time.monotonic() + self.checkpoint_minutes * 60
        if stop or time.monotonic() >= self.deadline:
            (self.run / "STOP").unlink(missing_ok=True)
            return True
        return False


def checkpoint_fields(model: torch.nn.Module) -> dict:
    """What a checkpoint needs to rebuild the model: its family and config."""
    return {"arch": type(model).ARCH, "config": dataclasses.asdict(model.cfg)}


def save_checkpoint(path, model, optimizer, state: dict, tokenizer: Tokenizer) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            **checkpoint_fields(model),
            "tokenizer": tokenizer.to_str(),
            "state": state,
            "rng": torch.get_rng_state(),
        },
        tmp,
    )
    tmp.replace(path)  # atomic: a kill mid-save never leaves a broken checkpoint


def build_model(arch: str, config: dict, architectures: Architectures) -> torch.nn.Module:
    if arch not in architectures:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {sorted(architectures)}")
    model_cls, config_cls = architectures[arch]
    return model_cls(config_cls(**config))


def load_checkpoint(path: pathlib.Path, architectures: Architectures) -> tuple[torch.nn.Module, Tokenizer]:
    """Loads a training checkpoint (weights + family + config + tokenizer JSON) for export or evaluation.
    Checkpoints without an `arch` predate the recurrent translator: they hold a Transformer."""
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    model = build_model(ckpt.get("arch", "transformer"), ckpt["config"], architectures)
    model.load_state_dict({k: v.float() for k, v in ckpt["model"].items()})
    return model.eval(), Tokenizer.from_str(ckpt["tokenizer"])
