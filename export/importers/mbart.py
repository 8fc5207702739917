"""mBART-50 checkpoints (`MBartForConditionalGeneration`, mbart-large-50-many-to-many-mmt style) -> the model
contract.

mBART-50 translates as NLLB does, so this family reuses m2m100.py's tokenizer, language and manifest code;
what differs is the Transformer:
- learned position tables, one per side, read at position + 2 (`MBartLearnedPositionalEmbedding.offset`;
  pads take their position like any token) -> seq2seq_graphs.export with both tables;
- `layernorm_embedding` after the embeddings on each side, pre-norm layers with final norms, embeddings
  scaled inside the embedding module, tied output projection, `final_logits_bias` (zeros as saved)
  -> seq2seq_graphs.Layout(pre_norm=True, position_offset=2), the norms read from the model;
- the language codes (`en_XX`, `zh_CN`, ...: tokenizer_config `additional_special_tokens`, MBart50Tokenizer's
  52) -> source and target languages; MBart50Tokenizer writes `[src_lang] text </s>` -> manifest
  `source_language_prefix`; generate starts at </s> and forces the target code (`forced_bos_token_id`)
  -> `decoder_start` and `forced_first_token`;
- generation_config `num_beams` 5, `early_stopping: true` -> `decoding`; `forced_eos_token_id` (EOS forced at
  max_length) is not reproduced: the server stops there with finish reason `length` (docs/import.md).
"""

from __future__ import annotations

import json
import pathlib
import re

from attnserve.export.importers import m2m100, seq2seq_graphs
from attnserve.export.importers.checkpoint import Checkpoint

ARCHITECTURE = "MBartForConditionalGeneration"
MBART50_CODE = re.compile(r"^[a-z]{2}_[A-Z]{2}$")  # en_XX, zh_CN
DEFAULT_SOURCE = "en_XX"  # MBart50Tokenizer's src_lang when the tokenizer_config names none
# Keys of old BART configs that transformers' mBART has no code for: each only at the value mBART computes.
IGNORED_KEYS = {
    "normalize_before": (True,), "add_final_layer_norm": (True,), "normalize_embedding": (True,),
    "static_position_embeddings": (False,), "add_bias_logits": (False,),
}
GENERATION_HANDLED = m2m100.GENERATION_HANDLED | {"forced_eos_token_id"}
GENERATION_DEFAULTS = {k: v for k, v in m2m100.GENERATION_DEFAULTS.items() if k != "forced_eos_token_id"}


def check_config(ckpt: Checkpoint) -> dict:
    """Refuses what the importer cannot map; returns the generation settings."""
    if ckpt.architecture != ARCHITECTURE:
        raise ValueError(f"{ckpt.folder}: architecture {ckpt.architecture} is not {ARCHITECTURE}")
    ckpt.check_keys(m2m100.HANDLED_KEYS, IGNORED_KEYS)
    activation = ckpt.config.get("activation_function", "gelu")
    if activation not in m2m100.ACTIVATIONS:
        raise ValueError(f"{ckpt.folder}/config.json: activation_function {activation!r} is not one of "
                         f"{m2m100.ACTIVATIONS}")
    return ckpt.generation(GENERATION_HANDLED, GENERATION_DEFAULTS)


def load_model(ckpt: Checkpoint):
    """The checkpoint as a transformers MBartForConditionalGeneration (eager attention, eval mode)."""
    from transformers import MBartConfig, MBartForConditionalGeneration

    config = MBartConfig.from_dict(ckpt.config)
    config._attn_implementation = "eager"
    # Tied to model.shared, which transformers saves (final_logits_bias is saved too, or zeros).
    derived = {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "final_logits_bias"}
    if getattr(config, "tie_word_embeddings", True):
        derived.add("lm_head.weight")
    model, _ = ckpt.load_into(MBartForConditionalGeneration(config), derived)
    return model


def import_checkpoint(ckpt: Checkpoint, out_dir: pathlib.Path, name: str, version: int,
                      given_languages: list[str] | None = None) -> dict:
    """Writes the graphs, tokenizer and manifest of an mBART-50 checkpoint; returns the manifest."""
    generation = check_config(ckpt)
    tokenizer_config = ckpt.json("tokenizer_config.json", default={})
    tokenizer = m2m100.write_tokenizer(ckpt, out_dir)
    codes = m2m100.language_codes(ckpt, tokenizer_config, tokenizer.get_vocab(with_added_tokens=True), MBART50_CODE)
    default = tokenizer_config.get("src_lang") or DEFAULT_SOURCE
    languages = m2m100.chosen_languages(codes, given_languages, default, ckpt.folder)
    model = load_model(ckpt)
    core = model.model
    offset = core.encoder.embed_positions.offset
    tables = (core.encoder.embed_positions.weight, core.decoder.embed_positions.weight)
    seq2seq_graphs.export(model, seq2seq_graphs.Layout(pre_norm=True, position_offset=offset), tables, out_dir)
    manifest = m2m100.build_manifest(model.config, generation, tokenizer, name, version,
                                     {c: codes[c] for c in languages}, family="mBART-50")
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return manifest
