"""M2M100 and NLLB-200 checkpoints (`M2M100ForConditionalGeneration`) -> the model contract.

What such a checkpoint holds and where it goes:
- the Transformer (pre-norm with final norms, M2M100's sinusoidal positions: offset by padding_idx + 1, the
  pad token on the table's zero row; embeddings scaled inside the embedding module, `scale_embedding`; tied
  output projection) -> encoder.onnx and a cached decoder step with every layer's and head's
  cross-attention (seq2seq_graphs.py, Layout(pre_norm=True, position_offset=2, pad_position=1));
- the source language: NLLB's tokenizer writes `[eng_Latn] text </s>` -> manifest `source_language_prefix`
  (each language's token), read from the request's source language (TextInput.source_language);
- the target language: generate starts the decoder with `decoder_start_token_id` (</s>) and forces the
  language token as the first output (`forced_bos_token_id`) -> `decoder_start` (</s> for every language)
  and `forced_first_token` (each language's token), so the output starts with it, as generate's does;
- NLLB's language codes (tokenizer_config `additional_special_tokens`: eng_Latn, zho_Hant, ...) -> the
  model's source and target languages (`--languages` serves a subset; its first is the default);
- tokenizer.json (NLLB's, as its checkpoints ship it) -> tokenizer.json without its post-processor (the
  server adds the language token and </s>); transformers 5 ignores `clean_up_tokenization_spaces` for
  BPE tokenizers such as NLLB's, and so does the server.
- M2M100's own tokenizer (vocab.json + sentencepiece.bpe.model, no tokenizer.json; `__en__` tokens after the
  vocabulary, served as `en`) -> source_tokenizer.json + source_vocab.json + tokenizer.json
  (m2m100_tokenizer.py; manifest `tokenizer.source`, as for Marian).
"""

from __future__ import annotations

import json
import pathlib
import re

from tokenizers import Tokenizer

from attnserve.export.importers import seq2seq_graphs
from attnserve.export.importers.checkpoint import Checkpoint, decoding_fields

ARCHITECTURE = "M2M100ForConditionalGeneration"
ACTIVATIONS = ("relu", "gelu", "gelu_new", "swish", "silu")
HANDLED_KEYS = frozenset({
    "d_model", "encoder_layers", "decoder_layers", "num_hidden_layers", "encoder_attention_heads",
    "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "vocab_size", "max_position_embeddings",
    "activation_function", "scale_embedding",
})
GENERATION_HANDLED = frozenset({
    "bos_token_id", "decoder_start_token_id", "eos_token_id", "pad_token_id", "max_length", "num_beams",
    "forced_bos_token_id", "early_stopping", "transformers_version", "_from_model_config",
})
GENERATION_DEFAULTS = {"length_penalty": 1.0, "no_repeat_ngram_size": 0, "do_sample": False,
                       "num_beam_groups": 1, "repetition_penalty": 1.0,
                       "forced_eos_token_id": None, "bad_words_ids": None}
NLLB_CODE = re.compile(r"^[a-z]{3}_[A-Z][a-z]{3}$")  # eng_Latn, zho_Hant


def check_config(ckpt: Checkpoint) -> dict:
    """Refuses what the importer cannot map; returns the generation settings."""
    if ckpt.architecture != ARCHITECTURE:
        raise ValueError(f"{ckpt.folder}: architecture {ckpt.architecture} is not {ARCHITECTURE}")
    ckpt.check_keys(HANDLED_KEYS)
    activation = ckpt.config.get("activation_function", "relu")
    if activation not in ACTIVATIONS:
        raise ValueError(f"{ckpt.folder}/config.json: activation_function {activation!r} is not one of {ACTIVATIONS}")
    return ckpt.generation(GENERATION_HANDLED, GENERATION_DEFAULTS)


def load_model(ckpt: Checkpoint):
    """The checkpoint as a transformers M2M100ForConditionalGeneration (eager attention, eval mode)."""
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    config = M2M100Config.from_dict(ckpt.config)
    config._attn_implementation = "eager"
    # Tied to model.shared, which transformers saves; the position tables are computed, never saved.
    derived = {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"}
    if getattr(config, "tie_word_embeddings", True):
        derived.add("lm_head.weight")
    model, _ = ckpt.load_into(M2M100ForConditionalGeneration(config), derived)
    return model


def language_codes(ckpt: Checkpoint, tokenizer_config: dict, vocab: dict[str, int],
                   pattern: re.Pattern = NLLB_CODE) -> dict[str, int]:
    """The language codes (NLLB's by default) and their token ids, in the tokenizer_config's order (else the
    vocabulary's)."""
    listed = tokenizer_config.get("additional_special_tokens") or tokenizer_config.get("extra_special_tokens") or []
    listed = [t if isinstance(t, str) else t.get("content", "") for t in listed]
    codes = [t for t in listed if pattern.match(t)]
    codes = codes or sorted((t for t in vocab if pattern.match(t)), key=vocab.get)
    missing = [c for c in codes if c not in vocab]
    if missing or not codes:
        raise ValueError(f"{ckpt.folder}/tokenizer.json: no token for language code(s) {missing[:5] or '(none found)'}")
    return {c: vocab[c] for c in codes}


def chosen_languages(codes: dict[str, int], given: list[str] | None, default: str, folder: pathlib.Path) -> list[str]:
    """The languages served: `--languages` (a subset, its first the default), else every code with the
    tokenizer's default source language first."""
    if given:
        unknown = [c for c in given if c not in codes]
        if unknown:
            raise ValueError(f"--languages {unknown} are not language codes of {folder} (e.g. {', '.join(list(codes)[:3])})")
        return list(dict.fromkeys(given))
    return [default, *(c for c in codes if c != default)] if default in codes else list(codes)


def write_m2m100_tokenizers(ckpt: Checkpoint, tokenizer_config: dict, out_dir: pathlib.Path) -> dict[str, int]:
    """M2M100Tokenizer's files rebuilt (m2m100_tokenizer.py); returns code ("en") -> language token id."""
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    from attnserve.export.importers import m2m100_tokenizer

    family = tokenizer_config.get("language_codes", "m2m100")
    if family not in FAIRSEQ_LANGUAGE_CODES:
        raise ValueError(f"{ckpt.folder}/tokenizer_config.json: language_codes {family!r} is not one of "
                         f"{sorted(FAIRSEQ_LANGUAGE_CODES)}")
    codes = list(FAIRSEQ_LANGUAGE_CODES[family])
    ids = m2m100_tokenizer.write(ckpt.path("sentencepiece.bpe.model"), ckpt.json("vocab.json"),
                                 [f"__{c}__" for c in codes], out_dir, ckpt.config["vocab_size"])
    return {c: ids[f"__{c}__"] for c in codes}


def write_tokenizer(ckpt: Checkpoint, out_dir: pathlib.Path) -> Tokenizer:
    """tokenizer.json: the checkpoint's, without its post-processor (the server adds the language token
    and </s>), decoding as transformers' decode(skip_special_tokens=True)."""
    tokenizer = Tokenizer.from_file(str(ckpt.path("tokenizer.json")))
    tokenizer.post_processor = None
    tokenizer.no_truncation()
    tokenizer.no_padding()
    tokenizer.save(str(out_dir / "tokenizer.json"))
    return tokenizer


def import_checkpoint(ckpt: Checkpoint, out_dir: pathlib.Path, name: str, version: int,
                      given_languages: list[str] | None = None) -> dict:
    """Writes the graphs, tokenizer and manifest of an NLLB / M2M100 checkpoint; returns the manifest."""
    generation = check_config(ckpt)
    tokenizer_config = ckpt.json("tokenizer_config.json", default={})
    if tokenizer_config.get("legacy_behaviour"):  # `text </s> [src_lang]`: not the prefix layout served here
        raise ValueError(f"{ckpt.folder}/tokenizer_config.json: legacy_behaviour=True is not supported")
    if (ckpt.folder / "tokenizer.json").is_file() or not (ckpt.folder / "vocab.json").is_file():
        tokenizer = write_tokenizer(ckpt, out_dir)
        codes = language_codes(ckpt, tokenizer_config, tokenizer.get_vocab(with_added_tokens=True))
        default, source_spec = tokenizer_config.get("src_lang") or "eng_Latn", {}
    else:  # M2M100's own: vocab.json + sentencepiece.bpe.model, `__en__` tokens after the vocabulary
        codes = write_m2m100_tokenizers(ckpt, tokenizer_config, out_dir)
        default = tokenizer_config.get("src_lang") or "en"
        source_spec = {"source": {"file": "source_tokenizer.json", "vocab": "source_vocab.json"}}
        tokenizer = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    languages = chosen_languages(codes, given_languages, default, ckpt.folder)
    model = load_model(ckpt)
    pad = model.config.pad_token_id
    layout = seq2seq_graphs.Layout(pre_norm=True, position_offset=pad + 1, pad_position=pad)
    seq2seq_graphs.export(model, layout, model.model.encoder.embed_positions.weights, out_dir)
    manifest = build_manifest(model.config, generation, tokenizer, name, version, {c: codes[c] for c in languages})
    manifest["tokenizer"].update(source_spec)
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return manifest


def build_manifest(config, generation: dict, tokenizer: Tokenizer, name: str, version: int,
                   codes: dict[str, int], family: str = "NLLB / M2M100") -> dict:
    eos = generation.get("eos_token_id", config.eos_token_id)
    start = generation.get("decoder_start_token_id", config.decoder_start_token_id)
    max_positions = config.max_position_embeddings
    languages = list(codes)
    return {
        "format_version": 1,
        "name": name,
        "version": version,
        "task": "translation",
        "description": f"{family} between {len(languages)} languages, imported from a transformers checkpoint",
        "languages": {"source": languages, "target": languages},
        "tokenizer": {"file": "tokenizer.json", "word_boundary": "metaspace-cjk"},
        "special_tokens": {"pad": generation.get("pad_token_id", config.pad_token_id),
                           "unk": tokenizer.token_to_id("<unk>"), "eos": eos, "suppress": []},
        "decoder_start": {lang: start for lang in languages},
        "source_language_prefix": codes,
        "forced_first_token": codes,
        # Source: the language token, the text, </s>; output: the language token first, then the text.
        "limits": {"max_source_tokens": max_positions,
                   "max_new_tokens": min(generation.get("max_length", max_positions), max_positions) - 1},
        **decoding_fields(generation),
        **seq2seq_graphs.manifest_graph_fields(config),
    }
