"""The model families the training script, exporter and evaluation know, by the name checkpoints record."""

from __future__ import annotations

import dataclasses
import pathlib

import torch
from tokenizers import Tokenizer

from attnserve.export.image.model import ShowAttendTell, ShowAttendTellConfig
from attnserve.export.translation.model import Transformer, TransformerConfig
from attnserve.export.translation.recurrent import RecurrentConfig, RecurrentTranslator
from attnserve.export.speech.model import ListenAttendSpell, ListenAttendSpellConfig

# Checkpoint "arch" -> (model class, config class). Checkpoints without the key predate the recurrent model.
ARCHITECTURES = {
    "transformer": (Transformer, TransformerConfig),
    "recurrent": (RecurrentTranslator, RecurrentConfig),
    "listen-attend-spell": (ListenAttendSpell, ListenAttendSpellConfig),
    "show-attend-tell": (ShowAttendTell, ShowAttendTellConfig),
}


def build_model(arch: str, config: dict) -> torch.nn.Module:
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {sorted(ARCHITECTURES)}")
    model_cls, config_cls = ARCHITECTURES[arch]
    return model_cls(config_cls(**config))


def arch_of(model: torch.nn.Module) -> str:
    return next(name for name, (cls, _) in ARCHITECTURES.items() if isinstance(model, cls))


def checkpoint_fields(model: torch.nn.Module) -> dict:
    """What a checkpoint needs to rebuild the model: its family and config."""
    return {"arch": arch_of(model), "config": dataclasses.asdict(model.cfg)}


def load_checkpoint(path: pathlib.Path) -> tuple[torch.nn.Module, Tokenizer]:
    """Loads a training checkpoint (weights + family + config + tokenizer JSON) for export or evaluation."""
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    model = build_model(ckpt.get("arch", "transformer"), ckpt["config"])
    model.load_state_dict({k: v.float() for k, v in ckpt["model"].items()})
    return model.eval(), Tokenizer.from_str(ckpt["tokenizer"])
