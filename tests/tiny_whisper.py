"""A tiny Whisper checkpoint folder built here: openai/whisper-tiny's published config.json,
generation_config.json and preprocessor_config.json (tests/fixtures/hf/whisper-tiny, see its README) with
only the sizes changed, a byte-level BPE tokenizer trained on generated lines with Whisper's special tokens
after it in their order, and random weights widened so that cross-attention is peaked.

Token ids: the fixture's are the published ones (text below 50257, then <|endoftext|>,
<|startoftranscript|>, the 99 languages, <|translate|>, <|transcribe|>, <|startoflm|>, <|startofprev|>,
<|nocaptions|>, <|notimestamps|>, 1,501 timestamps). The tiny vocabulary keeps that order after its own
text pieces, so every special id moves by (text pieces - 50257); 220 (GPT-2's "Ġ") becomes the tiny "Ġ";
other text ids are kept where the tiny vocabulary has them. No hub access: everything from the fixtures and a seed.
"""

from __future__ import annotations

import json
import pathlib
import random

import tiny_marian

PUBLISHED_TEXT = 50257  # GPT-2's text tokens; <|endoftext|> is the first special
# Only these change from the published whisper-tiny (d_model 384, 4+4 layers, 6 heads, FFN 1536, 448 positions).
SIZES = {"d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "num_hidden_layers": 2,
         "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 64,
         "decoder_ffn_dim": 64, "max_target_positions": 64}
ALIGNMENT_HEADS = [[1, 0], [1, 2], [1, 3]]  # published [[2, 2], [3, 0], ...] name layers the tiny model lacks
TEXT_PIECES = 420
MAX_LENGTH = 64
LOGIT_SCALE = 3.0
TABLE_SCALE = 5.0
TIMESTAMP_SCALE = 0.3
FRONT_END_SCALE = 3.0
POSITIONS_SCALE = 0.2
EOS_PULL = 3.0  # the final norm's bias moved towards <|endoftext|>: some outputs end early


def _special_tokens(codes: list[str]) -> list[str]:
    return (["<|endoftext|>", "<|startoftranscript|>", *[f"<|{c}|>" for c in codes], "<|translate|>",
             "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>", "<|notimestamps|>"]
            + [f"<|{i * 0.02:.2f}|>" for i in range(1501)])


def _tokenizer(folder: pathlib.Path, codes: list[str], seed: int, text_size: int | None = None) -> int:
    """tokenizer.json (byte-level BPE as WhisperTokenizerFast's) and tokenizer_config.json; returns the
    number of text pieces (`text_size`: filled up to that many with pieces no text makes)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(seed)
    lines = [tiny_marian.en_line(rng) for _ in range(400)] + [tiny_marian.zh_line(rng) for _ in range(100)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TEXT_PIECES, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(lines, trainer)
    if text_size is not None:  # the benchmark's published 50,257 text pieces
        tok.add_tokens([AddedToken(f"Ġfill{i}", normalized=False) for i in range(text_size - tok.get_vocab_size())])
    text = tok.get_vocab_size()
    specials = _special_tokens(codes)
    # As the published file: the timestamps are added tokens but not special.
    tok.add_tokens([AddedToken(t, special=not t[2].isdigit(), normalized=False) for t in specials])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "WhisperTokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "model_max_length": 1024,
        "add_prefix_space": False, "errors": "replace"}, indent=2))
    return text


def _remap(value, text: int, space: int):
    """A published token id (or a structure of them) at the tiny vocabulary's ids; None when it has none."""
    if isinstance(value, list):
        mapped = [_remap(v, text, space) for v in value]
        return [m for m in mapped if m is not None] if all(not isinstance(v, list) for v in value) else mapped
    if isinstance(value, dict):
        return {k: _remap(v, text, space) for k, v in value.items()}
    if not isinstance(value, int) or isinstance(value, bool):
        return value
    if value >= PUBLISHED_TEXT:
        return value - PUBLISHED_TEXT + text
    if value == 220:
        return space
    return value if value < text else None


ID_KEYS = ("begin_suppress_tokens", "bos_token_id", "decoder_start_token_id", "eos_token_id", "pad_token_id",
           "suppress_tokens", "lang_to_id", "task_to_id", "no_timestamps_token_id", "prev_sot_token_id",
           "forced_decoder_ids")


def _configs(fixture: pathlib.Path, text: int, space: int, vocab_size: int, real_sizes: bool = False) -> tuple[dict, dict]:
    config = json.loads((fixture / "config.json").read_text())
    generation = json.loads((fixture / "generation_config.json").read_text())
    for table in (config, generation):
        for key in ID_KEYS:
            if key in table and key != "forced_decoder_ids":
                table[key] = _remap(table[key], text, space)
        if table.get("pad_token_id", 0) is None:  # large-v3's 50256: the last text piece
            table["pad_token_id"] = text - 1
        if table.get("forced_decoder_ids"):  # [position, id or null] pairs: only the ids move
            table["forced_decoder_ids"] = [[p, None if i is None else _remap(i, text, space)]
                                           for p, i in table["forced_decoder_ids"]]
    if not real_sizes:
        config.update(SIZES, vocab_size=vocab_size, max_length=MAX_LENGTH)
        generation.update(max_length=MAX_LENGTH, alignment_heads=ALIGNMENT_HEADS)
    return config, generation


# openai/whisper-base's published sizes and alignment heads, for the benchmark (`real_sizes="base"`).
BASE = {"d_model": 512, "encoder_layers": 6, "decoder_layers": 6, "num_hidden_layers": 6, "encoder_attention_heads": 8,
        "decoder_attention_heads": 8, "encoder_ffn_dim": 2048, "decoder_ffn_dim": 2048}
BASE_ALIGNMENT_HEADS = [[3, 1], [4, 2], [4, 3], [4, 7], [5, 1], [5, 2], [5, 4], [5, 6]]


def build(folder: pathlib.Path, seed: int = 0, real_sizes: bool | str = False, fixture: str = "whisper-tiny") -> pathlib.Path:
    """Writes the checkpoint folder and returns it.

    Args:
        real_sizes: whisper-tiny's published sizes and token ids (51,865 tokens: the text pieces filled up to
            50,257), for bench/import_whisper_ctranslate2.py; "base": whisper-base's sizes.
        fixture: the published configs to start from (tests/fixtures/hf/: whisper-tiny, whisper-large-v3).
    """
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    folder.mkdir(parents=True, exist_ok=True)
    configs = tiny_marian.FIXTURES / fixture
    published = json.loads((configs / "generation_config.json").read_text())
    codes = [t[2:-2] for t in published["lang_to_id"]]
    text = _tokenizer(folder, codes, seed, PUBLISHED_TEXT if real_sizes else None)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    config, generation = _configs(configs, text, tok.token_to_id("Ġ"), tok.get_vocab_size(with_added_tokens=True),
                                  real_sizes)
    if real_sizes == "base":
        config.update(BASE)
        generation.update(alignment_heads=BASE_ALIGNMENT_HEADS)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2))
    (folder / "preprocessor_config.json").write_text((configs / "preprocessor_config.json").read_text())
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(WhisperConfig.from_dict(config)).eval()
    with torch.no_grad():
        _widen(model, config["eos_token_id"], text + 2 + len(codes) + 6)  # <|0.00|>: after the specials
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items() if k != "proj_out.weight"}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def _widen(model, eos: int, first_timestamp: int) -> None:
    """Peaked attention over the frames (tiny_marian's widening) that depends on the audio (front end
    louder than the encoder's positions), logits of a few units, timestamp tokens rarer than text (as in a
    model trained with <|notimestamps|>), a pull towards EOS."""
    import torch

    tiny_marian.sharpen_cross_attention(model)
    encoder = model.model.encoder
    for conv in (encoder.conv1, encoder.conv2):
        conv.weight.mul_(FRONT_END_SCALE)
    encoder.embed_positions.weight.mul_(POSITIONS_SCALE)
    norm = model.model.decoder.layer_norm
    norm.weight.mul_(LOGIT_SCALE)
    table = model.model.decoder.embed_tokens.weight
    # pad = eos: initialised as the embedding's zero padding row, which a trained checkpoint's is not.
    table[eos] = torch.randn(table.shape[1]) * table.std()
    table.mul_(TABLE_SCALE)
    table[first_timestamp:].mul_(TIMESTAMP_SCALE)
    norm.bias.add_(EOS_PULL * table[eos] / table[eos].norm() ** 2)


def transformers_model(folder: pathlib.Path):
    import torch
    from transformers import WhisperForConditionalGeneration

    return WhisperForConditionalGeneration.from_pretrained(str(folder), attn_implementation="eager", dtype=torch.float32,
                                                           local_files_only=True).eval()


def transformers_tokenizer(folder: pathlib.Path):
    from transformers import WhisperTokenizer

    return WhisperTokenizer.from_pretrained(str(folder), local_files_only=True)


def feature_extractor(fixture: str = "whisper-tiny"):
    from transformers import WhisperFeatureExtractor

    configs = tiny_marian.FIXTURES / fixture
    return WhisperFeatureExtractor(**{k: v for k, v in json.loads((configs / "preprocessor_config.json").read_text()).items()
                                      if k not in ("feature_extractor_type", "processor_class")})


def clips(count: int, seed: int = 0) -> list:
    """`count` mono 16 kHz float32 clips of 1-6 s: tones, chirps and noise bursts (distinct encodings)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        n = int(rng.uniform(1.0, 6.0) * 16000)
        t = np.arange(n) / 16000
        f0, f1 = rng.uniform(100, 3000, 2)
        x = 0.3 * np.sin(2 * np.pi * (f0 + (f1 - f0) * t / t[-1] / 2) * t) + 0.05 * rng.standard_normal(n)
        x *= (np.sin(2 * np.pi * rng.uniform(0.5, 3) * t) > -0.3)  # bursts: pauses the attention can follow
        out.append(x.astype(np.float32))
    return out
