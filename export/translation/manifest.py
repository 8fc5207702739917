"""The manifest fields every zh-TW <-> en translator shares (docs/model-contract.md); the Transformer's and
the recurrent translator's exporters fill in their graphs' attention, decoder inputs, static and state."""

from __future__ import annotations

from tokenizers import Tokenizer

from attnserve.export.translation import bpe


def translation_manifest(
    tokenizer: Tokenizer,
    name: str,
    version: int,
    description: str,
    attention: dict,
    decoder_inputs: dict,
    static: list[dict],
    state: list[dict],
    model_config: dict,
    **extra,
) -> dict:
    """What every zh-TW <-> en translator's manifest shares around its architecture-specific parts."""
    max_positions = model_config["max_positions"]
    # Requests that name no search get this many beams (the manifest's decoding.beam_size); none = greedy.
    decoding = {"decoding": {"beam_size": extra["default_beam_size"]}} if extra.get("default_beam_size") else {}
    return {
        "format_version": 1,
        "name": name,
        "version": version,
        "task": "translation",
        "description": description,
        "languages": {"source": ["en", "zh-TW"], "target": ["en", "zh-TW"]},
        "tokenizer": {"file": "tokenizer.json", "word_boundary": "metaspace-cjk"},
        "special_tokens": {
            "pad": bpe.PAD_ID,
            "unk": bpe.UNK_ID,
            "eos": bpe.EOS_ID,
            "suppress": list(extra.get("suppress_ids", bpe.suppressed_ids(tokenizer))),
        },
        "decoder_start": bpe.language_token_ids(tokenizer),
        "limits": {
            "max_source_tokens": extra.get("max_source_tokens", max_positions // 2),
            "max_new_tokens": extra.get("max_new_tokens", max_positions // 2),
        },
        **decoding,
        "attention": {**attention, "default_layer": extra.get("attention_layer", -1)},
        "encoder": {"file": "encoder.onnx", "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask"}},
        "decoder": {"file": "decoder.onnx", "inputs": decoder_inputs, "outputs": {"logits": "logits"}},
        "static": static,
        "state": state,
        "model_config": model_config,
    }
