"""ViT + GPT-2 image captioners (`VisionEncoderDecoderModel`, nlpconnect/vit-gpt2-image-captioning style) ->
the model contract, served through the image input path (server/inputs/image.py).

What such a checkpoint holds and where it goes:
- config.json `encoder` (ViT) and `decoder` (GPT-2 with `add_cross_attention`) -> encoder.onnx (ViT, then each
  GPT-2 layer's cross K/V) and a cached GPT-2 step with every layer's and head's cross-attention
  (vision_graphs.py);
- preprocessor_config.json (ViTImageProcessor / ViTFeatureExtractor: resize to `size` with Pillow's bilinear
  filter, rescale by 1/255, normalise by image_mean / image_std) -> manifest `input` (kind image: the same
  resize, /255 and normalisation in server/inputs/image.py, numpy and Pillow only); other resampling
  filters or rescale factors are refused by name;
- the attention columns: ViT's class token, then its patch grid (image_size / patch_size square) ->
  `input.grid` rows x cols with `leading: ["cls"]`, so column 0 is labelled "cls" and the cells carry their
  pixel boxes (heatmaps skip the cls column);
- tokenizer.json (or GPT-2's vocab.json + merges.txt, converted by transformers' GPT2Tokenizer) -> tokenizer.json,
  words by the `byte-level` rule ("Ġ" starts a word);
- decoder_start_token_id / eos / pad (all <|endoftext|> for GPT-2) -> `decoder_start`, `special_tokens`;
  max_length (transformers' default 20 when unset) -> `limits.max_new_tokens` = max_length - 1; num_beams,
  early_stopping -> `decoding`.
"""

from __future__ import annotations

import json
import pathlib

from tokenizers import Tokenizer

from attnserve.export.importers import vision_graphs
from attnserve.export.importers.checkpoint import (
    BOOKKEEPING_KEYS,
    GENERATION_KEYS,
    Checkpoint,
    decoding_fields,
)

ARCHITECTURE = "VisionEncoderDecoderModel"
MAX_IMAGE_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_LENGTH = 20  # transformers' GenerationConfig default, which generate uses when the checkpoint names none
TOP_KEYS = frozenset({"encoder", "decoder", "model_type", "is_encoder_decoder", "tie_word_embeddings",
                      "decoder_start_token_id", "bos_token_id", "eos_token_id", "pad_token_id"})
# Keys of a ViT config. ViT is traced as transformers runs it, so each of these is computed as transformers
# computes it; a key outside them is refused, as for every family.
VIT_KEYS = frozenset({
    "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
    "hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range", "layer_norm_eps", "image_size",
    "patch_size", "num_channels", "qkv_bias", "encoder_stride", "pooler_output_size", "pooler_act",
})
# Keys of a GPT-2 config the decoder step reads (its modules hold the rest of their computation), and keys
# that matter only for other heads or for training.
GPT2_KEYS = frozenset({
    "vocab_size", "n_positions", "n_ctx", "n_embd", "n_layer", "n_head", "n_inner", "activation_function",
    "layer_norm_epsilon", "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "add_cross_attention",
    "resid_pdrop", "embd_pdrop", "attn_pdrop", "initializer_range", "summary_type", "summary_use_proj",
    "summary_activation", "summary_proj_to_labels", "summary_first_dropout",
})
GPT2_IGNORED = {"reorder_and_upcast_attn": (False,)}
# What an old nested config dumps besides its own keys (PretrainedConfig's attributes); generate reads the
# top level's generation settings.
NESTED_KEYS = BOOKKEEPING_KEYS | GENERATION_KEYS | {
    "architectures", "cross_attention_hidden_size", "encoder_no_repeat_ngram_size", "exponential_decay_length_penalty",
    "output_scores", "return_dict_in_generate", "remove_invalid_values", "sep_token_id", "tie_encoder_decoder",
    "typical_p", "begin_suppress_tokens", "suppress_tokens", "is_encoder_decoder",
}
GENERATION_HANDLED = frozenset({
    "bos_token_id", "decoder_start_token_id", "eos_token_id", "pad_token_id", "max_length", "num_beams",
    "early_stopping", "transformers_version", "_from_model_config",
})
GENERATION_DEFAULTS = {"length_penalty": 1.0, "no_repeat_ngram_size": 0, "do_sample": False, "num_beam_groups": 1,
                       "repetition_penalty": 1.0, "forced_eos_token_id": None, "bad_words_ids": None}
# Buffers transformers 4 saved with every GPT-2 attention (the causal mask and its fill value).
GPT2_STALE_BUFFERS = (".attn.bias", ".attn.masked_bias", ".crossattention.bias", ".crossattention.masked_bias")
PROCESSOR_TYPES = ("ViTImageProcessor", "ViTImageProcessorPil", "ViTImageProcessorFast", "ViTFeatureExtractor")
BILINEAR = 2  # PIL.Image.Resampling.BILINEAR, what server/inputs/image.py resizes with


def check_config(ckpt: Checkpoint) -> dict:
    """Refuses what the importer cannot map; returns the generation settings."""
    if ckpt.architecture != ARCHITECTURE:
        raise ValueError(f"{ckpt.folder}: architecture {ckpt.architecture} is not {ARCHITECTURE}")
    ckpt.check_keys(TOP_KEYS)
    _check_part(ckpt, "encoder", "vit", VIT_KEYS, {})
    _check_part(ckpt, "decoder", "gpt2", GPT2_KEYS, GPT2_IGNORED)
    if not ckpt.config["decoder"].get("add_cross_attention"):
        raise ValueError(f"{ckpt.folder}/config.json: decoder.add_cross_attention is not true: GPT-2 cannot "
                         f"read the image")
    return ckpt.generation(GENERATION_HANDLED, GENERATION_DEFAULTS)


def _check_part(ckpt: Checkpoint, part: str, model_type: str, keys: frozenset, ignored: dict) -> None:
    """config.json's nested `part` must be a `model_type` config with known keys only (values as `ignored`)."""
    sub = ckpt.config.get(part)
    where = f"{ckpt.folder}/config.json: {part}"
    if not isinstance(sub, dict) or sub.get("model_type") != model_type:
        found = sub.get("model_type") if isinstance(sub, dict) else sub
        raise ValueError(f"{where}.model_type {found!r} is not supported: the importer reads a {model_type} {part}")
    for key, value in sub.items():
        if key in ignored and value not in ignored[key]:
            raise ValueError(f"{where}.{key}={value!r} is not supported (the importer handles {ignored[key]!r})")
        if key not in keys and key not in ignored and key not in NESTED_KEYS:
            raise ValueError(f"{where}: key {key!r} is not handled by the importer")


def image_input(ckpt: Checkpoint) -> dict:
    """The manifest's `input` from preprocessor_config.json and the ViT config.

    Raises:
        ValueError: a processor, resampling filter, rescale factor or size the server does not reproduce.
    """
    p, vit = ckpt.json("preprocessor_config.json"), ckpt.config["encoder"]
    where = f"{ckpt.folder}/preprocessor_config.json"
    kind = p.get("image_processor_type") or p.get("feature_extractor_type")
    if kind not in PROCESSOR_TYPES:
        raise ValueError(f"{where}: processor {kind!r} is not one of {PROCESSOR_TYPES}")
    side = vit.get("image_size", 224)
    size = p.get("size", side)
    height, width = (size, size) if isinstance(size, int) else (size.get("height"), size.get("width"))
    checks = [
        ("do_resize", p.get("do_resize", True), True), ("resample", p.get("resample", BILINEAR), BILINEAR),
        ("size", (height, width), (side, side)),
        ("do_rescale", p.get("do_rescale", True), True),
        ("rescale_factor", round(p.get("rescale_factor", 1 / 255) * 255, 9), 1.0),
    ]
    for key, value, wanted in checks:
        if value != wanted:
            raise ValueError(f"{where}: {key}={p.get(key)!r} is not supported (the server resizes to the ViT's "
                             f"{side} x {side} with Pillow's bilinear filter and rescales by 1/255)")
    channels = vit.get("num_channels", 3)
    mean, std = p.get("image_mean", [0.5] * channels), p.get("image_std", [0.5] * channels)
    if not p.get("do_normalize", True):
        mean, std = [0.0] * channels, [1.0] * channels
    cells = side // vit.get("patch_size", 16)
    return {"kind": "image", "height": side, "width": side, "channels": channels,
            "normalize": {"mean": mean, "std": std},
            "grid": {"rows": cells, "cols": cells, "leading": ["cls"]},  # ViT's class token first
            "max_bytes": MAX_IMAGE_BYTES, "max_pixels": 40_000_000}


def write_tokenizer(ckpt: Checkpoint, out_dir: pathlib.Path) -> Tokenizer:
    """tokenizer.json: the checkpoint's, else GPT-2's vocab.json + merges.txt as GPT2Tokenizer builds them."""
    if (ckpt.folder / "tokenizer.json").is_file():
        tokenizer = Tokenizer.from_file(str(ckpt.folder / "tokenizer.json"))
    else:
        from transformers import GPT2Tokenizer

        ckpt.path("vocab.json"), ckpt.path("merges.txt")  # named when missing
        tokenizer = GPT2Tokenizer.from_pretrained(str(ckpt.folder), local_files_only=True).backend_tokenizer
    tokenizer.no_truncation()
    tokenizer.no_padding()
    tokenizer.save(str(out_dir / "tokenizer.json"))
    return tokenizer


def load_model(ckpt: Checkpoint):
    """The checkpoint as a transformers VisionEncoderDecoderModel (eager attention, eval mode)."""
    from transformers import VisionEncoderDecoderConfig, VisionEncoderDecoderModel

    config = VisionEncoderDecoderConfig.from_dict(ckpt.config)
    for part in (config, config.encoder, config.decoder):
        part._attn_implementation = "eager"
    # GPT-2's lm_head is tied to its wte; the causal-mask buffers of old GPT-2 checkpoints are not weights.
    derived = {"decoder.lm_head.weight"}
    model, _ = ckpt.load_into(VisionEncoderDecoderModel(config=config), derived, stale=GPT2_STALE_BUFFERS)
    return model


def import_checkpoint(ckpt: Checkpoint, out_dir: pathlib.Path, name: str, version: int,
                      given_languages: list[str] | None = None) -> dict:
    """Writes the graphs, tokenizer and manifest of a ViT + GPT-2 captioner; returns the manifest."""
    generation = check_config(ckpt)
    spec = image_input(ckpt)
    tokenizer = write_tokenizer(ckpt, out_dir)
    model = load_model(ckpt)
    vision_graphs.export(model, out_dir)
    manifest = build_manifest(model.config, generation, tokenizer, spec, name, version, (given_languages or ["en"])[0])
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return manifest


def build_manifest(config, generation: dict, tokenizer: Tokenizer, spec: dict, name: str, version: int,
                   language: str) -> dict:
    gpt = config.decoder
    eos = generation.get("eos_token_id", config.eos_token_id)
    start = generation.get("decoder_start_token_id", config.decoder_start_token_id)
    pad = generation.get("pad_token_id", config.pad_token_id)
    max_length = generation.get("max_length", DEFAULT_MAX_LENGTH)
    vit = config.encoder
    return {
        "format_version": 1,
        "name": name,
        "version": version,
        "task": "image-captioning",
        "description": (f"ViT ({vit.image_size} x {vit.image_size}, {vit.patch_size}-pixel patches) + GPT-2 image "
                        f"captioner, imported from a transformers checkpoint"),
        "languages": {"source": [language], "target": [language]},
        "tokenizer": {"file": "tokenizer.json", "word_boundary": "byte-level"},
        "special_tokens": {"pad": eos if pad is None else pad, "unk": _unk(tokenizer, eos), "eos": eos, "suppress": []},
        "decoder_start": {language: start},
        "input": spec,
        # The decoder start takes position 0 of n_positions.
        "limits": {"max_new_tokens": min(max_length, gpt.n_positions) - 1},
        **decoding_fields(generation),
        **vision_graphs.manifest_graph_fields(config),
    }


def _unk(tokenizer: Tokenizer, eos: int) -> int:
    """GPT-2's byte-level BPE has no unknown token (every byte is a piece): the contract's unk is then EOS."""
    unk = tokenizer.token_to_id("<unk>")
    return eos if unk is None else unk
