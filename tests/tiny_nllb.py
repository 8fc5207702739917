"""A tiny NLLB-200 checkpoint folder built here: the published facebook/nllb-200-distilled-600M config.json,
generation_config.json and tokenizer_config.json (tests/fixtures/hf/nllb-200-distilled-600M, with NLLB's 202
language codes) with only the sizes changed, a SentencePiece BPE model trained on a few hundred generated
lines turned into an NLLB tokenizer.json (fairseq ids: <s> <pad> </s> <unk>, the pieces, the 202 codes,
<mask>), and random weights widened so that attention is peaked.

No hub access: nothing is downloaded, everything is made from the fixtures and a seed.
"""

from __future__ import annotations

import json
import pathlib
import random

import tiny_marian

FIXTURES = tiny_marian.FIXTURES
SIZES = tiny_marian.SIZES  # the same tiny sizes (published: d_model 1024, 12+12 layers, 16 heads, FFN 4096)
MAX_LENGTH = 40
LOGIT_SCALE = 3.0  # the decoder's final norm gain
EOS_PULL = 3.0  # the final norm's bias moved towards </s>'s embedding: some outputs end early
TABLE_SCALE = 5.0  # the shared embedding table (logits of a few units, varied outputs)


def _tokenizer_json(spm: bytes, folder: pathlib.Path, codes: list[str]) -> None:
    """NLLB's tokenizer.json: transformers' conversion of the BPE model, then the codes and <mask> as added
    special tokens after the pieces (as the published file numbers them)."""
    from tokenizers import AddedToken
    from transformers import NllbTokenizer

    spm_dir = folder / "spm"
    spm_dir.mkdir()
    (spm_dir / "sentencepiece.bpe.model").write_bytes(spm)
    backend = NllbTokenizer.from_pretrained(str(spm_dir)).backend_tokenizer
    backend.add_special_tokens([AddedToken(c, special=True, normalized=False) for c in codes])
    backend.add_special_tokens([AddedToken("<mask>", special=True, lstrip=True, normalized=True)])
    backend.save(str(folder / "tokenizer.json"))
    (spm_dir / "sentencepiece.bpe.model").unlink()
    spm_dir.rmdir()


def _m2m100_tokenizer(spm: bytes, folder: pathlib.Path) -> int:
    """M2M100's files: sentencepiece.bpe.model and a fairseq-style vocab.json (<s> <pad> </s> <unk>, the
    pieces); returns the model's vocabulary size (+ 100 language tokens + 8 made-up words, as transformers')."""
    import sentencepiece

    (folder / "sentencepiece.bpe.model").write_bytes(spm)
    sp = sentencepiece.SentencePieceProcessor(model_proto=spm)
    pieces = ["<s>", "<pad>", "</s>", "<unk>"]
    pieces += [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i))]
    (folder / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}, ensure_ascii=False))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
        "language_codes": "m2m100", "num_madeup_words": 8, "src_lang": None, "tgt_lang": None,
        "model_max_length": 1024, "tokenizer_class": "M2M100Tokenizer"}))
    return len(pieces) + 100 + 8


def build(folder: pathlib.Path, seed: int = 0, m2m100: bool = False) -> pathlib.Path:
    """Writes the checkpoint folder and returns it.

    Args:
        m2m100: facebook/m2m100_418M's configs (num_beams 5, early_stopping true, as published) and
            M2M100's own tokenizer files instead.
    """
    import torch
    from tokenizers import Tokenizer
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    lines = [tiny_marian.zh_line(rng) for _ in range(300)] + [tiny_marian.en_line(rng) for _ in range(300)]
    spm = tiny_marian.train_spm(lines, 300, "bpe")
    fixture = FIXTURES / ("m2m100_418M" if m2m100 else "nllb-200-distilled-600M")
    if m2m100:
        vocab_size = _m2m100_tokenizer(spm, folder)
    else:
        tokenizer_config = json.loads((fixture / "tokenizer_config.json").read_text())
        _tokenizer_json(spm, folder, tokenizer_config["additional_special_tokens"])
        (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
        vocab_size = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    config = write_configs(fixture, folder, vocab_size)
    torch.manual_seed(seed)
    model = M2M100ForConditionalGeneration(M2M100Config.from_dict(config)).eval()
    with torch.no_grad():
        _widen(model, config["eos_token_id"])
    save_tied(model, folder)
    return folder


def write_configs(fixture: pathlib.Path, folder: pathlib.Path, vocab_size: int) -> dict:
    """The fixture's config.json and generation_config.json with the tiny sizes; returns the config."""
    config = json.loads((fixture / "config.json").read_text())
    config.update(SIZES, vocab_size=vocab_size, max_length=MAX_LENGTH)
    generation = json.loads((fixture / "generation_config.json").read_text())
    generation.update(max_length=MAX_LENGTH)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return config


def save_tied(model, folder: pathlib.Path) -> None:
    """model.safetensors as transformers saves a tied BART-family model: the shared table once (the
    encoder/decoder embeddings and lm_head are tied to it)."""
    from safetensors.torch import save_file

    tied = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items() if k not in tied}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _widen(model, eos: int) -> None:
    """Peaked attention (tiny_marian's widening), logits of a few units, a pull towards </s>."""
    tiny_marian.sharpen_cross_attention(model)
    norm = model.model.decoder.layer_norm
    norm.weight.mul_(LOGIT_SCALE)
    table = model.model.shared.weight
    table.mul_(TABLE_SCALE)
    norm.bias.add_(EOS_PULL * table[eos] / table[eos].norm() ** 2)


def transformers_model(folder: pathlib.Path):
    from transformers import M2M100ForConditionalGeneration

    return M2M100ForConditionalGeneration.from_pretrained(str(folder), attn_implementation="eager",
                                                          local_files_only=True).eval()


def transformers_tokenizer(folder: pathlib.Path, src_lang: str = "eng_Latn"):
    from transformers import AutoTokenizer, M2M100Tokenizer

    if (folder / "vocab.json").is_file():  # M2M100's own (slow, sentencepiece) tokenizer
        return M2M100Tokenizer.from_pretrained(str(folder), local_files_only=True, src_lang=src_lang)
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True, src_lang=src_lang)
