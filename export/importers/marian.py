"""MarianMT (OPUS-MT) checkpoints -> the model contract.

What a Marian checkpoint holds and where it goes:
- the Transformer (post-norm, static sinusoidal positions from 0, embeddings x sqrt(d_model), swish / relu /
  gelu feed-forward, `final_logits_bias`, shared or separate source/target embeddings) -> encoder.onnx and
  a decoder step with the K/V cache and every layer's and head's cross-attention (seq2seq_graphs.py);
- source.spm + vocab.json -> source_tokenizer.json + source_vocab.json (reads the source text, numbered by
  vocab.json; the manifest's `tokenizer.source`); vocab.json (or target_vocab.json when `separate_vocabs`)
  -> tokenizer.json (writes the output) (sentencepiece_tokenizer.py);
- generation_config.json: decoder start = pad (`decoder_start_token_id`), `bad_words_ids` (single tokens)
  -> `special_tokens.suppress`, `num_beams` -> `decoding.beam_size`, `max_length` -> `limits.max_new_tokens`;
- tokenizer_config.json `source_lang` / `target_lang` -> `languages` (or `--languages`).
A multilingual Marian model (target-language tokens `>>cmn_Hant<<` in its vocabulary, written at the start
of the source) serves each code as a target language; the manifest's `source_prefix` puts the request's
target-language token before the source, as a user of MarianTokenizer writes it into the text.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from attnserve.export.importers import sentencepiece_tokenizer as spm_tokenizer
from attnserve.export.importers import seq2seq_graphs
from attnserve.export.importers.checkpoint import Checkpoint, decoding_fields

ARCHITECTURE = "MarianMTModel"
ACTIVATIONS = ("swish", "silu", "relu", "gelu", "gelu_new")
HANDLED_KEYS = frozenset({
    "d_model", "encoder_layers", "decoder_layers", "num_hidden_layers", "encoder_attention_heads",
    "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "vocab_size", "decoder_vocab_size",
    "max_position_embeddings", "activation_function", "scale_embedding", "share_encoder_decoder_embeddings",
})
# Keys with no effect on MarianMTModel's computation at these values (transformers' Marian has no code for
# the others: a checkpoint that needs them was not written by its converter).
IGNORED_KEYS = {
    "static_position_embeddings": (True,), "normalize_before": (False,), "normalize_embedding": (False,),
    "add_final_layer_norm": (False,), "add_bias_logits": (False,), "extra_pos_embeddings": None,
}
# generation_config.json keys the manifest expresses, and those that must keep transformers' defaults.
GENERATION_HANDLED = frozenset({
    "bad_words_ids", "bos_token_id", "decoder_start_token_id", "eos_token_id", "pad_token_id", "max_length",
    "num_beams", "early_stopping", "forced_eos_token_id", "renormalize_logits", "transformers_version",
    "_from_model_config",
})
GENERATION_DEFAULTS = {"length_penalty": 1.0, "no_repeat_ngram_size": 0, "do_sample": False,
                       "num_beam_groups": 1, "repetition_penalty": 1.0}
SPECIAL_PIECES = ("</s>", "<unk>", "<pad>")


@dataclasses.dataclass(frozen=True)
class Vocabularies:
    source: dict[str, int]
    target: dict[str, int]
    separate: bool


def load_model(ckpt: Checkpoint):
    """The checkpoint as a transformers MarianMTModel (eager attention, eval mode).

    Raises:
        ValueError: the weights do not fit the config (unexpected or missing tensors).
    """
    from transformers import MarianConfig, MarianMTModel

    config = MarianConfig.from_dict(ckpt.config)
    config._attn_implementation = "eager"
    # Not saved by transformers: the static position tables, and weights tied to the one it keeps.
    derived = {"model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"}
    if getattr(config, "tie_word_embeddings", True):
        derived.add("lm_head.weight")
    if config.share_encoder_decoder_embeddings:
        derived |= {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"}
    model, state = ckpt.load_into(MarianMTModel(config), derived)
    if "final_logits_bias" not in state:
        raise ValueError(f"{ckpt.weights_path}: no final_logits_bias tensor")
    return model


def check_config(ckpt: Checkpoint) -> dict:
    """Refuses what the importer cannot map; returns the generation settings (generation_config.json, else
    the old config's own keys)."""
    if ckpt.architecture != ARCHITECTURE:
        raise ValueError(f"{ckpt.folder}: architecture {ckpt.architecture} is not {ARCHITECTURE}")
    ckpt.check_keys(HANDLED_KEYS, IGNORED_KEYS)
    activation = ckpt.config.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        raise ValueError(f"{ckpt.folder}/config.json: activation_function {activation!r} is not one of {ACTIVATIONS}")
    generation = ckpt.generation(GENERATION_HANDLED, GENERATION_DEFAULTS)
    bad = generation.get("bad_words_ids") or []
    if any(len(sequence) != 1 for sequence in bad):
        raise ValueError(f"{ckpt.folder}: bad_words_ids of more than one token are not supported: {bad!r}")
    return generation


def vocabularies(ckpt: Checkpoint, tokenizer_config: dict) -> Vocabularies:
    """vocab.json (and target_vocab.json for separate vocabularies), checked for what the server needs."""
    separate = bool(tokenizer_config.get("separate_vocabs", False))
    source = ckpt.json("vocab.json")
    target = ckpt.json("target_vocab.json") if separate else source
    for name, vocab in (("vocab.json", source), ("target_vocab.json", target)):
        missing = [p for p in SPECIAL_PIECES if p not in vocab]
        if missing:
            raise ValueError(f"{ckpt.folder}/{name}: no {', '.join(missing)} piece")
    differ = [p for p in ("</s>", "<unk>") if source[p] != target[p]]
    if differ:
        raise ValueError(f"{ckpt.folder}: {', '.join(differ)} have different ids in vocab.json and target_vocab.json")
    return Vocabularies(source, target, separate)


def target_codes(vocabs: Vocabularies) -> dict[str, int]:
    """A multilingual model's target languages (`>>cmn_Hant<<` -> "cmn_Hant") and their source tokens, as
    MarianTokenizer finds them (`supported_language_codes`: shared vocabularies only); empty otherwise."""
    if vocabs.separate:
        return {}
    return {p[2:-2]: i for p, i in vocabs.source.items() if p.startswith(">>") and p.endswith("<<") and len(p) > 4}


def write_tokenizers(ckpt: Checkpoint, vocabs: Vocabularies, out_dir: pathlib.Path) -> None:
    """source_tokenizer.json with source_vocab.json, and tokenizer.json."""
    proto = spm_tokenizer.parse_model(ckpt.path("source.spm").read_bytes())
    source, _ = spm_tokenizer.source_tokenizer(proto, vocabs.source, SPECIAL_PIECES, "<unk>")
    source.save(str(out_dir / "source_tokenizer.json"))
    (out_dir / "source_vocab.json").write_text(json.dumps(vocabs.source, ensure_ascii=False, indent=0) + "\n")
    # Decoding drops, besides the special tokens, the pieces SentencePiece itself decodes to nothing.
    spm_file = "target.spm" if vocabs.separate else "source.spm"  # what MarianTokenizer.decode uses
    decoding = spm_tokenizer.parse_model(ckpt.path(spm_file).read_bytes())
    control = {p.piece for p in decoding.pieces if p.type in (2, 3)} & set(vocabs.target)
    target = spm_tokenizer.target_tokenizer(vocabs.target, [*SPECIAL_PIECES, *sorted(control)], "<unk>")
    target.save(str(out_dir / "tokenizer.json"))


def languages(tokenizer_config: dict, given: list[str] | None, folder: pathlib.Path,
              codes: dict[str, int]) -> tuple[str, list[str]]:
    """The source language and the target languages: a multilingual model's are its codes, and --languages
    then names the source only."""
    wanted = 1 if codes else 2
    if given:
        if len(given) != wanted:
            what = "the source language of a multilingual" if codes else "the source and the target language of a"
            raise ValueError(f"--languages takes {what} Marian model, got {given}")
        return given[0], list(codes) or [given[1]]
    source, target = tokenizer_config.get("source_lang"), tokenizer_config.get("target_lang")
    if not source or not (target or codes):
        raise ValueError(f"{folder}/tokenizer_config.json names no source_lang/target_lang: give --languages")
    return str(source), list(codes) or [str(target)]


def import_checkpoint(ckpt: Checkpoint, out_dir: pathlib.Path, name: str, version: int,
                      given_languages: list[str] | None = None) -> dict:
    """Writes the graphs, tokenizers and manifest of a Marian checkpoint into out_dir; returns the manifest."""
    generation = check_config(ckpt)
    tokenizer_config = ckpt.json("tokenizer_config.json", default={})
    vocabs = vocabularies(ckpt, tokenizer_config)
    codes = target_codes(vocabs)
    source_lang, target_langs = languages(tokenizer_config, given_languages, ckpt.folder, codes)
    model = load_model(ckpt)
    positions = model.model.decoder.embed_positions.weight  # the encoder's table is the same
    seq2seq_graphs.export(model, seq2seq_graphs.Layout(pre_norm=False), positions, out_dir)
    write_tokenizers(ckpt, vocabs, out_dir)
    manifest = build_manifest(model.config, generation, vocabs, name, version, source_lang, target_langs, codes)
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return manifest


def build_manifest(config, generation: dict, vocabs: Vocabularies, name: str, version: int,
                   source: str, targets: list[str], codes: dict[str, int]) -> dict:
    eos = generation.get("eos_token_id", config.eos_token_id)
    pad = generation.get("pad_token_id", config.pad_token_id)
    suppress = sorted({s[0] for s in generation.get("bad_words_ids") or []} - {eos})
    max_positions = config.max_position_embeddings
    return {
        "format_version": 1,
        "name": name,
        "version": version,
        "task": "translation",
        "description": f"MarianMT {source} -> {', '.join(targets)}, imported from a transformers checkpoint",
        "languages": {"source": [source], "target": targets},
        "tokenizer": {"file": "tokenizer.json", "word_boundary": "metaspace-cjk",
                      "source": {"file": "source_tokenizer.json", "vocab": "source_vocab.json"}},
        "special_tokens": {"pad": pad, "unk": vocabs.target["<unk>"], "eos": eos, "suppress": suppress},
        "decoder_start": {t: generation.get("decoder_start_token_id", config.decoder_start_token_id) for t in targets},
        # A multilingual model reads the language to write as a token before the text (`>>cmn_Hant<<`).
        **({"source_prefix": codes} if codes else {}),
        # Source positions 0..P-1 (EOS included); the decoder start token takes position 0 of P.
        "limits": {"max_source_tokens": max_positions,
                   "max_new_tokens": min(generation.get("max_length", max_positions), max_positions) - 1},
        **decoding_fields(generation),
        **seq2seq_graphs.manifest_graph_fields(config),
    }
