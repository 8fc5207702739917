"""The translators the training script, exporter and evaluation know, by the name checkpoints record."""

from __future__ import annotations

import pathlib

import torch
from tokenizers import Tokenizer

from attnserve.export.common import training
from attnserve.export.translation.model import Transformer, TransformerConfig
from attnserve.export.translation.recurrent import RecurrentConfig, RecurrentTranslator

# Checkpoint "arch" -> (model class, config class).
ARCHITECTURES: training.Architectures = {
    Transformer.ARCH: (Transformer, TransformerConfig),
    RecurrentTranslator.ARCH: (RecurrentTranslator, RecurrentConfig),
}


def build_model(arch: str, config: dict) -> torch.nn.Module:
    return training.build_model(arch, config, ARCHITECTURES)


def load_checkpoint(path: pathlib.Path) -> tuple[torch.nn.Module, Tokenizer]:
    """A translator's training checkpoint (weights + family + config + tokenizer) for export or evaluation."""
    return training.load_checkpoint(path, ARCHITECTURES)
