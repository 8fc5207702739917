"""SentencePiece models + a model's own vocabulary -> Hugging Face `tokenizers` files (tokenizer.json).

Marian (OPUS-MT) and M2M100 checkpoints tokenize with SentencePiece but number the pieces by their own
`vocab.json`, not by the SentencePiece model's ids; a piece the vocabulary lacks becomes `<unk>`. The server
tokenizes with `tokenizers` only (no sentencepiece in the serving install), so this module rebuilds each
side:

- encoding (`source_tokenizer`): a Unigram model holding the SentencePiece model's pieces and scores, each at
  the id the checkpoint's vocabulary gives it, with SentencePiece's normalizer (its precompiled character
  map, then its whitespace rules: leading and trailing spaces dropped, runs of spaces collapsed) and its
  word-boundary marker `▁` (a dummy prefix). Vocabulary ids whose piece the SentencePiece model lacks hold
  a placeholder with a plain space in it, which no text can reach (every space has become `▁` by then);
  SentencePiece pieces the vocabulary lacks are kept, after the vocabulary, so that text still segments as
  SentencePiece would. The manifest's `tokenizer.source.vocab` (the vocabulary itself) tells the server
  that ids from its size on read as `<unk>`, and that a run of characters the segmenter did not know is
  looked up by its text, as transformers looks SentencePiece's unknown pieces up in vocab.json.
- decoding (`target_tokenizer`): the vocabulary's pieces as a word-level table; decoding drops special
  tokens, joins the pieces, turns `▁` into spaces and (the server) strips the ends: exactly what `MarianTokenizer`'s
  `decode(..., skip_special_tokens=True)` does with `sentencepiece`'s `decode_pieces` (which leaves
  pieces it does not know as they are).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

METASPACE = "\u2581"
# sentencepiece_model.proto ModelProto.SentencePiece.Type
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
_MODEL_TYPES = {"unigram": 1, "bpe": 2}  # TrainerSpec.ModelType


def parse_model(data: bytes, model_type: str = "unigram"):
    """The SentencePiece ModelProto of a `.spm` / `.model` file's bytes.

    Raises:
        ValueError: the bytes are not a SentencePiece model, or one this module cannot rebuild (BPE,
            byte fallback, whitespace as suffix).
    """
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as exc:  # protobuf's DecodeError
        raise ValueError(f"not a SentencePiece model: {exc}") from exc
    if not proto.pieces:
        raise ValueError("not a SentencePiece model: it has no pieces")
    trainer, spec = proto.trainer_spec, proto.normalizer_spec
    unsupported = {
        f"model_type other than {model_type}": trainer.model_type != _MODEL_TYPES[model_type],
        "byte_fallback": trainer.byte_fallback,
        "treat_whitespace_as_suffix": trainer.treat_whitespace_as_suffix,
        "escape_whitespaces false": not spec.escape_whitespaces,
    }
    found = [name for name, present in unsupported.items() if present]
    if found:
        raise ValueError(f"SentencePiece model uses {', '.join(found)}, which the importer does not rebuild")
    return proto


def source_tokenizer(proto, vocab: Mapping[str, int], special: Iterable[str], unk: str) -> tuple[Tokenizer, int]:
    """The encoding tokenizer for text read with `proto`, numbered by `vocab`.

    Args:
        proto: the SentencePiece ModelProto (parse_model).
        vocab: piece -> model id (the checkpoint's vocab.json), ids 0..N-1.
        special: the vocabulary's special tokens (matched in text before segmentation, as transformers does).
        unk: the unknown token's piece.

    Returns:
        The tokenizer and N: ids >= N are SentencePiece pieces the model lacks, read as `unk`.
    """
    size = _check_dense(vocab)
    scores = {p.piece: p.score for p in proto.pieces if p.type in (_NORMAL, _USER_DEFINED)}
    floor = min(scores.values(), default=0.0)  # placeholders must not lower the unknown-piece penalty
    special = list(special)
    by_id = {i: piece for piece, i in vocab.items()}
    table = []
    for i in range(size):
        piece = by_id[i]
        if piece in scores:
            table.append((piece, scores[piece]))
        elif piece in special or piece == unk:
            table.append((piece, floor))
        else:
            table.append((f"{METASPACE}unreachable {i}", floor))  # holds a space: no text matches it
    table += [(piece, score) for piece, score in scores.items() if piece not in vocab]
    tokenizer = Tokenizer(models.Unigram(table, unk_id=vocab[unk], byte_fallback=False))
    return with_spm_rules(tokenizer, proto, special), size


def with_spm_rules(tokenizer: Tokenizer, proto, special: Iterable[str]) -> Tokenizer:
    """`tokenizer` reading text as SentencePiece model `proto` does: its normalizer, `▁` word marker and
    whitespace splitting; `special` tokens matched in the text first."""
    tokenizer.normalizer = _normalizer(proto)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=METASPACE, prepend_scheme="always" if proto.normalizer_spec.add_dummy_prefix else "never",
        split=proto.trainer_spec.split_by_whitespace,
    )
    tokenizer.decoder = _decoder()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    return tokenizer


def target_tokenizer(vocab: Mapping[str, int], special: Iterable[str], unk: str) -> Tokenizer:
    """The decoding tokenizer of output ids numbered by `vocab` (see the module docstring)."""
    _check_dense(vocab)
    tokenizer = Tokenizer(models.WordLevel(dict(vocab), unk_token=unk))
    tokenizer.decoder = _decoder()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    return tokenizer


def _normalizer(proto) -> normalizers.Normalizer:
    """SentencePiece's normalization: the character map, then (remove_extra_whitespaces) spaces trimmed at
    both ends and collapsed inside. Only U+0020 counts: the map has turned other spaces into it."""
    steps = []
    if proto.normalizer_spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap))
    if proto.normalizer_spec.remove_extra_whitespaces:
        steps += [normalizers.Replace(Regex("^ +| +$"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    return normalizers.Sequence(steps)


def _decoder() -> decoders.Decoder:
    """Pieces joined, `▁` as spaces (MarianTokenizer.convert_tokens_to_string); the server's Tokenizer.decode
    strips the spaces at both ends (tokenizers' own Strip decoder panics on a text of spaces only)."""
    return decoders.Sequence([decoders.Replace(METASPACE, " "), decoders.Fuse()])


def _check_dense(vocab: Mapping[str, int]) -> int:
    """N, when the vocabulary's ids are exactly 0..N-1.

    Raises:
        ValueError: ids are missing or repeated.
    """
    ids = sorted(vocab.values())
    if ids != list(range(len(ids))):
        raise ValueError(f"vocabulary ids are not 0..{len(ids) - 1} without gaps or repeats")
    return len(ids)
