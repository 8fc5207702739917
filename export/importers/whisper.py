"""Whisper checkpoints (`WhisperForConditionalGeneration`, every size, 80- or 128-mel) -> the model contract.

What such a checkpoint holds and where it goes:
- the Transformer (conv front end, sinusoidal encoder positions stored as weights, learned decoder
  positions, pre-norm layers with final norms, tied `proj_out`) -> encoder.onnx over the 30 s log-mel window
  and a cached decoder step with every layer's and head's cross-attention (whisper_graphs.py);
- preprocessor_config.json (WhisperFeatureExtractor: n_fft, hop, n_mels, 16 kHz, 30 s chunks) -> the
  manifest's `input.features` with Whisper's options (server/inputs/features.py: centred frames, Slaney
  mel filters, log10, max - 8 clamp, (x + 4) / 4, padded to the window); 2 frames per encoder position;
- the prompt `<|startoftranscript|> <|lang|> <|transcribe|> <|notimestamps|>` -> `decoder_start` (the
  start token) and `decoder_prompt` (language -> the three tokens after it, forced and not counted as
  generated, as generate's decoder_input_ids); `detect_language`: a request naming no language gets the
  argmax of the first step over the language tokens, as WhisperForConditionalGeneration.detect_language;
- generation_config `suppress_tokens` -> `special_tokens.suppress`, `begin_suppress_tokens` ->
  `special_tokens.begin_suppress` (the first step after the prompt), `alignment_heads` and config
  `median_filter_width` -> `word_timestamps` (DTW over those heads, server/attention/alignment.py);
- tokenizer.json (WhisperTokenizerFast's byte-level BPE) -> tokenizer.json without its post-processor, the
  timestamp tokens marked special (decode drops them, as WhisperTokenizer.decode does), words split at `Ġ`.

- task=translate (generation_config task_to_id) -> `speech_translation`: a request with source language X
  and target "en" gets `<|X|> <|translate|> <|notimestamps|>`.

Not served: timestamp-token decoding (`return_timestamps`), prompts of previous text (`prompt_ids`),
temperature fallback; they are refused or simply not asked for (docs/import.md).
"""

from __future__ import annotations

import json
import pathlib
import re

from attnserve.export.importers import whisper_graphs
from attnserve.export.importers.checkpoint import Checkpoint

ARCHITECTURE = "WhisperForConditionalGeneration"
HANDLED_KEYS = frozenset({
    "d_model", "encoder_layers", "decoder_layers", "num_hidden_layers", "encoder_attention_heads",
    "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "vocab_size", "max_source_positions",
    "max_target_positions", "num_mel_bins", "activation_function", "median_filter_width", "forced_decoder_ids",
})
# Keys with no effect on transcription at the values given (None: any value).
IGNORED_KEYS = {
    "scale_embedding": (False,),  # Whisper's forward never scales its embeddings; refuse what would differ
    "use_weighted_layer_sum": (False,), "classifier_proj_size": None,  # audio classification heads only
    # SpecAugment: training only
    "apply_spec_augment": None, "mask_time_prob": None, "mask_time_length": None, "mask_time_min_masks": None,
    "mask_feature_prob": None, "mask_feature_length": None, "mask_feature_min_masks": None,
}
GENERATION_HANDLED = frozenset({
    "alignment_heads", "begin_suppress_tokens", "bos_token_id", "decoder_start_token_id", "eos_token_id",
    "pad_token_id", "forced_decoder_ids", "is_multilingual", "lang_to_id", "task_to_id", "max_length",
    "no_timestamps_token_id", "suppress_tokens", "transformers_version", "_from_model_config",
    # used only by timestamp-token decoding and by prompting with previous text, neither served
    "max_initial_timestamp_index", "prev_sot_token_id",
})
GENERATION_DEFAULTS = {"return_timestamps": False, "num_beams": 1, "do_sample": False, "length_penalty": 1.0,
                       "no_repeat_ngram_size": 0, "repetition_penalty": 1.0, "early_stopping": False}
FEATURES_HANDLED = frozenset({
    "feature_extractor_type", "feature_size", "sampling_rate", "n_fft", "hop_length", "chunk_length",
    "n_samples", "nb_max_frames", "padding_value", "padding_side", "return_attention_mask", "processor_class",
    "dither",
})
LANGUAGE_TOKEN = re.compile(r"^<\|([a-z]{2,3}(?:[_-][A-Za-z]+)?)\|>$")
TIMESTAMP_TOKEN = re.compile(r"^<\|\d+\.\d\d\|>$")
# Clips per encoder call: on one CPU thread 16 whisper-tiny-sized clips took 41 s in encoder batches of up to
# 16 and 28 s in batches of 4 (the decode rows joined either way); a batch adds (B, H, 1500, 1500) scores.
MAX_ENCODER_BATCH = 4
MAX_AUDIO_BYTES = 16 * 2**20  # a 30 s window is under 4 MB as 32-bit float; WAVs at 48 kHz stereo fit


def check_config(ckpt: Checkpoint) -> dict:
    """Refuses what the importer cannot map; returns the generation settings."""
    if ckpt.architecture != ARCHITECTURE:
        raise ValueError(f"{ckpt.folder}: architecture {ckpt.architecture} is not {ARCHITECTURE}")
    ckpt.check_keys(HANDLED_KEYS, IGNORED_KEYS)
    if ckpt.config.get("activation_function", "gelu") != "gelu":
        raise ValueError(f"{ckpt.folder}/config.json: activation_function "
                         f"{ckpt.config['activation_function']!r} is not 'gelu'")
    generation = ckpt.generation(GENERATION_HANDLED, GENERATION_DEFAULTS)
    for key in ("alignment_heads", "no_timestamps_token_id"):
        if key not in generation:
            raise ValueError(f"{ckpt.folder}/generation_config.json: missing {key!r}")
    return generation


def features(ckpt: Checkpoint) -> dict:
    """preprocessor_config.json -> the manifest's `input` (Whisper's log-mel, the 30 s window)."""
    pre = ckpt.json("preprocessor_config.json")
    unknown = sorted(set(pre) - FEATURES_HANDLED)
    if unknown:
        raise ValueError(f"{ckpt.folder}/preprocessor_config.json: key {unknown[0]!r} is not handled by the importer")
    if pre.get("feature_extractor_type", "WhisperFeatureExtractor") != "WhisperFeatureExtractor" or pre.get("dither", 0.0):
        raise ValueError(f"{ckpt.folder}/preprocessor_config.json: only WhisperFeatureExtractor without dither is supported")
    rate, n_fft, hop = pre["sampling_rate"], pre["n_fft"], pre["hop_length"]
    if pre["feature_size"] != ckpt.config["num_mel_bins"]:
        raise ValueError(f"{ckpt.folder}: preprocessor_config.json feature_size {pre['feature_size']} is not "
                         f"config.json num_mel_bins {ckpt.config['num_mel_bins']}")
    seconds = pre["chunk_length"]
    if round(seconds * rate / hop) != 2 * ckpt.config["max_source_positions"]:
        raise ValueError(f"{ckpt.folder}: a {seconds} s window gives {round(seconds * rate / hop)} frames; the "
                         f"encoder reads 2 x max_source_positions = {2 * ckpt.config['max_source_positions']}")
    return {
        "kind": "audio",
        "sample_rate_hz": rate,
        "features": {"type": "log-mel", "n_mels": pre["feature_size"], "window_ms": 1000 * n_fft / rate,
                     "shift_ms": 1000 * hop / rate, "n_fft": n_fft, "f_max": 8000.0, "log_floor": 1e-10,
                     "mel_scale": "slaney", "filter_norm": "slaney", "center": True, "log": "log10",
                     "dynamic_range": 8.0, "add": 4.0, "divide": 4.0, "pad_seconds": float(seconds)},
        "time_reduction": 2,  # conv2's stride: one encoder position per two frames (20 ms)
        "max_seconds": float(seconds),
        "max_bytes": MAX_AUDIO_BYTES,
    }


def load_model(ckpt: Checkpoint):
    """The checkpoint as a transformers WhisperForConditionalGeneration (eager attention, eval mode)."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig.from_dict(ckpt.config)
    config._attn_implementation = "eager"
    model, _ = ckpt.load_into(WhisperForConditionalGeneration(config), {"proj_out.weight"})  # tied to embed_tokens
    return model.float()  # the graphs are float32 (large-v3 is published in float16; --variant fp16 exists)


def write_tokenizer(ckpt: Checkpoint, out_dir: pathlib.Path) -> dict[str, int]:
    """tokenizer.json: the checkpoint's without its post-processor (the server feeds the prompt itself), the
    timestamp tokens special; returns every added token's id."""
    data = json.loads(ckpt.path("tokenizer.json").read_text(encoding="utf-8"))
    if (data.get("model") or {}).get("type") != "BPE" or (data.get("pre_tokenizer") or {}).get("type") != "ByteLevel":
        raise ValueError(f"{ckpt.folder}/tokenizer.json: not a byte-level BPE tokenizer (WhisperTokenizerFast's)")
    data["post_processor"] = None
    data["truncation"] = data["padding"] = None
    for token in data.get("added_tokens", []):
        if TIMESTAMP_TOKEN.match(token["content"]):
            token["special"] = True
    (out_dir / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    return {t["content"]: t["id"] for t in data.get("added_tokens", [])}


def prompts(ckpt: Checkpoint, generation: dict, added: dict[str, int], given: list[str] | None) -> dict[str, list[int]]:
    """Language -> the tokens after <|startoftranscript|>: the language, <|transcribe|>, <|notimestamps|>
    (English-only models: <|notimestamps|> alone, language "en")."""
    notimestamps = generation["no_timestamps_token_id"]
    if not generation.get("is_multilingual", True):
        return {"en": [notimestamps]}
    transcribe = (generation.get("task_to_id") or {}).get("transcribe", added.get("<|transcribe|>"))
    lang_to_id = generation.get("lang_to_id") or {t: i for t, i in added.items() if LANGUAGE_TOKEN.match(t)}
    codes = {LANGUAGE_TOKEN.match(t).group(1): i for t, i in lang_to_id.items() if LANGUAGE_TOKEN.match(t)}
    if transcribe is None or not codes:
        raise ValueError(f"{ckpt.folder}/generation_config.json: no task_to_id 'transcribe' or no lang_to_id")
    if given:
        unknown = [c for c in given if c not in codes]
        if unknown:
            raise ValueError(f"--languages {unknown} are not language codes of {ckpt.folder} (e.g. {', '.join(list(codes)[:3])})")
        codes = {c: codes[c] for c in dict.fromkeys(given)}
    return {code: [token, transcribe, notimestamps] for code, token in codes.items()}


def import_checkpoint(ckpt: Checkpoint, out_dir: pathlib.Path, name: str, version: int,
                      given_languages: list[str] | None = None) -> dict:
    """Writes the graphs, tokenizer and manifest of a Whisper checkpoint; returns the manifest."""
    generation = check_config(ckpt)
    audio = features(ckpt)
    added = write_tokenizer(ckpt, out_dir)
    prompt = prompts(ckpt, generation, added, given_languages)
    model = load_model(ckpt)
    whisper_graphs.export(model, out_dir)
    manifest = build_manifest(model.config, generation, audio, prompt, name, version)
    translate = (generation.get("task_to_id") or {}).get("translate")
    if translate is not None and "en" in prompt and len(prompt) > 1:  # task=translate: speech -> English
        manifest["speech_translation"] = {"target": "en", "prompt": {
            lang: [p[0], translate, *p[2:]] for lang, p in prompt.items() if lang != "en"}}
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return manifest


def build_manifest(config, generation: dict, audio: dict, prompt: dict[str, list[int]], name: str,
                   version: int) -> dict:
    eos = generation.get("eos_token_id", config.eos_token_id)
    start = generation.get("decoder_start_token_id", config.decoder_start_token_id)
    languages = list(prompt)
    return {
        "format_version": 1,
        "name": name,
        "version": version,
        "task": "speech-recognition",
        "description": f"Whisper speech recognizer ({len(languages)} languages), imported from a transformers checkpoint",
        "languages": {"source": languages, "target": languages},
        "tokenizer": {"file": "tokenizer.json", "word_boundary": "byte-level"},
        "special_tokens": {"pad": generation.get("pad_token_id", eos), "unk": eos, "eos": eos,
                           "suppress": [i for i in generation.get("suppress_tokens") or [] if i != eos],
                           "begin_suppress": list(generation.get("begin_suppress_tokens") or [])},
        "decoder_start": {lang: start for lang in languages},
        "decoder_prompt": prompt,
        "detect_language": len(languages) > 1,
        "input": audio,
        # Positions 0 .. max_target_positions - 1: the start token and at most this many outputs (prompt included).
        "limits": {"max_new_tokens": min(generation.get("max_length", config.max_target_positions),
                                         config.max_target_positions) - 1,
                   "max_encoder_batch": MAX_ENCODER_BATCH},
        "word_timestamps": {"alignment_heads": [list(h) for h in generation["alignment_heads"]],
                            "median_filter_width": getattr(config, "median_filter_width", 7)},
        **whisper_graphs.manifest_graph_fields(config),
    }
