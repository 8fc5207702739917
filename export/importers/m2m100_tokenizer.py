"""M2M100's own tokenizer (vocab.json + sentencepiece.bpe.model, `__en__` language tokens) -> tokenizers files.

M2M100Tokenizer segments with a SentencePiece BPE model and numbers the pieces by vocab.json (a piece it
lacks is `<unk>`); the language tokens follow the vocabulary (`__af__` at len(vocab), ...). As for Marian
(sentencepiece_tokenizer.py), the server reads with a source tokenizer of its own numbered by a source
vocabulary (manifest `tokenizer.source`): here a BPE model holding the SentencePiece model's merges (in the
order of its pieces, as transformers' converter derives them), the vocabulary's pieces at their ids, the
language tokens after them, and the pieces the vocabulary lacks after those (read as `<unk>`).
"""

from __future__ import annotations

import json
import pathlib

from tokenizers import Tokenizer, models

from attnserve.export.importers import sentencepiece_tokenizer as spm_tokenizer

SPECIAL = ("<s>", "<pad>", "</s>", "<unk>")


def write(spm_path: pathlib.Path, vocab: dict[str, int], lang_tokens: list[str], out_dir: pathlib.Path,
          model_vocab: int) -> dict[str, int]:
    """Writes source_tokenizer.json, source_vocab.json and tokenizer.json; returns the language tokens' ids.

    Args:
        model_vocab: the model's vocabulary size; ids after the language tokens (M2M100's `madeupword`s)
            decode to nothing, as M2M100Tokenizer decodes them to `<unk>` and skips it.

    Raises:
        ValueError: the vocabulary lacks a special piece, or its ids have gaps.
    """
    from transformers.tokenization_utils_base import generate_merges

    missing = [p for p in SPECIAL if p not in vocab]
    if missing:
        raise ValueError(f"vocab.json: no {', '.join(missing)} piece")
    proto = spm_tokenizer.parse_model(spm_path.read_bytes(), model_type="bpe")
    spm_ids = {p.piece: i for i, p in enumerate(proto.pieces)}
    size = len(vocab)
    langs = {t: size + i for i, t in enumerate(lang_tokens)}
    numbered = {**vocab, **langs}
    spm_tokenizer._check_dense(numbered)
    table = dict(numbered)
    for piece in spm_ids:  # reachable pieces the vocabulary lacks: after it, read as <unk> by the server
        table.setdefault(piece, len(table))
    bpe = models.BPE(table, generate_merges(spm_ids), unk_token="<unk>", fuse_unk=True, byte_fallback=False)
    source = spm_tokenizer.with_spm_rules(Tokenizer(bpe), proto, [*SPECIAL, *lang_tokens])
    source.save(str(out_dir / "source_tokenizer.json"))
    (out_dir / "source_vocab.json").write_text(json.dumps(numbered, ensure_ascii=False, indent=0) + "\n")
    madeup = [f"madeupword{i:04d}" for i in range(model_vocab - len(numbered))]
    output = {**numbered, **{w: len(numbered) + i for i, w in enumerate(madeup)}}
    target = spm_tokenizer.target_tokenizer(output, [*SPECIAL, *lang_tokens, *madeup], "<unk>")
    target.save(str(out_dir / "tokenizer.json"))
    return langs
