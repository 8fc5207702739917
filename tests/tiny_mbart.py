"""A tiny mBART-50 checkpoint folder built here: the published facebook/mbart-large-50-many-to-many-mmt
config.json, generation_config.json and tokenizer_config.json (tests/fixtures/hf/mbart-large-50-many-to-many-mmt,
written from knowledge of them: see its README) with only the sizes changed, a SentencePiece unigram model
trained on a few hundred generated lines turned into tokenizer.json by transformers' own MBart50Tokenizer
(fairseq ids: <s> <pad> </s> <unk>, the pieces, the 52 codes, <mask>), and random weights widened so that
attention is peaked.

No hub access: nothing is downloaded, everything is made from the fixtures and a seed.
"""

from __future__ import annotations

import pathlib
import random

import tiny_marian
import tiny_nllb

FIXTURE = tiny_marian.FIXTURES / "mbart-large-50-many-to-many-mmt"
# Learned position rows x15 (against the x5 token table: positions matter, outputs vary and end at
# different lengths, where x3 looped to the limit on 13 of 16), and a further pull towards </s>.
POSITION_SCALE = 15.0
EOS_PULL = 2.0


def _tokenizer(spm: bytes, folder: pathlib.Path) -> int:
    """tokenizer.json as MBart50Tokenizer converts the SentencePiece model; returns its vocabulary size."""
    from transformers import MBart50Tokenizer

    spm_dir = folder / "spm"
    spm_dir.mkdir()
    (spm_dir / "sentencepiece.bpe.model").write_bytes(spm)
    backend = MBart50Tokenizer.from_pretrained(str(spm_dir)).backend_tokenizer
    backend.save(str(folder / "tokenizer.json"))
    (spm_dir / "sentencepiece.bpe.model").unlink()
    spm_dir.rmdir()
    (folder / "tokenizer_config.json").write_text((FIXTURE / "tokenizer_config.json").read_text())
    return backend.get_vocab_size(with_added_tokens=True)


def build(folder: pathlib.Path, seed: int = 0) -> pathlib.Path:
    """Writes the checkpoint folder and returns it (the SentencePiece model kept as spm.model beside it)."""
    import torch
    from transformers import MBartConfig, MBartForConditionalGeneration

    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    lines = [tiny_marian.zh_line(rng) for _ in range(300)] + [tiny_marian.en_line(rng) for _ in range(300)]
    spm = tiny_marian.train_spm(lines, 300, "unigram")
    (folder.parent / "spm.model").write_bytes(spm)  # outside the checkpoint: the tokenizer test reads it
    vocab_size = _tokenizer(spm, folder)
    config = tiny_nllb.write_configs(FIXTURE, folder, vocab_size)
    torch.manual_seed(seed)
    model = MBartForConditionalGeneration(MBartConfig.from_dict(config)).eval()
    with torch.no_grad():
        tiny_nllb._widen(model, config["eos_token_id"])
        table, norm = model.model.shared.weight, model.model.decoder.layer_norm
        norm.bias.add_(EOS_PULL * table[config["eos_token_id"]] / table[config["eos_token_id"]].norm() ** 2)
        for side in (model.model.encoder, model.model.decoder):
            side.embed_positions.weight.mul_(POSITION_SCALE)
            side.layernorm_embedding.weight.uniform_(0.5, 1.5)  # not the identity gain: the norm is tested
            side.layernorm_embedding.bias.normal_(0.0, 0.1)
    tiny_nllb.save_tied(model, folder)
    return folder


def transformers_model(folder: pathlib.Path):
    from transformers import MBartForConditionalGeneration

    return MBartForConditionalGeneration.from_pretrained(str(folder), attn_implementation="eager",
                                                         local_files_only=True).eval()


def transformers_tokenizer(folder: pathlib.Path, src_lang: str = "en_XX"):
    from transformers import MBart50Tokenizer

    return MBart50Tokenizer.from_pretrained(str(folder), local_files_only=True, src_lang=src_lang)
