"""A tiny OPUS-MT checkpoint folder built here: the published opus-mt-zh-en config.json, generation_config.json
and tokenizer_config.json (tests/fixtures/hf/opus-mt-zh-en) with only the sizes changed, SentencePiece
models trained on a few hundred generated lines, a Marian-style vocab.json, and random weights widened so
that attention is peaked (random init attends almost uniformly, which would make attention checks vacuous).

No hub access: nothing is downloaded, everything is made from the fixtures and a seed.
"""

from __future__ import annotations

import io
import json
import pathlib
import random

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "hf"
# Only these change from the published opus-mt-zh-en config (d_model 512, 6+6 layers, 8 heads, FFN 2048,
# 65,001 pieces, 512 positions).
SIZES = {"d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "num_hidden_layers": 2,
         "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 64,
         "decoder_ffn_dim": 64, "max_position_embeddings": 64}
MAX_LENGTH = 40  # generation_config max_length at the tiny size
# Random init echoes one token whatever the source, with attention spread evenly. So the weights are widened:
# cross-attention queries and keys x SHARPNESS (peaked attention, checked by the tests), its values and
# output x SOURCE_WEIGHT (the output depends on what was attended), the last norm's gain x LOGIT_SCALE
# (logits of a few units), and EOS's final_logits_bias + EOS_BIAS (outputs end after a few to ~15 tokens).
SHARPNESS = 25.0
SOURCE_WEIGHT = 10.0
LOGIT_SCALE = 3.0
EOS_BIAS = 1.0

_ZH = ("我 你 他 她 們 的 是 不 了 在 有 人 這 中 大 來 上 國 個 到 說 時 要 就 出 會 可 也 你們 我們 知識 力量 天氣 "
       "公園 散步 檔案 選單 儲存 視窗 按鈕 程式 今天 明天 學生 老師 朋友 電腦 手機 吃飯 喝水 工作 學習 很 好 去 看 書 "
       "貓 狗 水 山 雨 風 花 字 門 車 家 錢 新 舊 早 晚 紅 白").split()
_EN = ("the a of to and in is you that it he was for on are as with his they I at be this have from or one had "
       "by word but not what all were we when your can said there use an each which she do how their if will up "
       "other about out many then them these so some her would make like him into time has look two more write "
       "go see number no way could people my than first water been call who its now find long down day did get "
       "come made may part weather park file menu window button program student teacher friend").split()
# Characters the tokenizers never saw, and text shapes that stress normalisation: unknown pieces, full-width
# forms, ligatures, odd spaces, emoji.
_ODD = ["😀", "Ⅻ", "ﬁ", "ｈｅｌｌｏ", "\u3000", "  ", "\t", "é", "ß", "Ω", "①", "…", "«»", "123", "3.14", "—", "鬱", "齉"]


def zh_line(rng: random.Random) -> str:
    return "".join(rng.choice(_ZH) for _ in range(rng.randint(2, 12))) + rng.choice(["。", "！", "？", "，", ""])


def en_line(rng: random.Random) -> str:
    words = " ".join(rng.choice(_EN) for _ in range(rng.randint(2, 12)))
    return words[:1].upper() + words[1:] + rng.choice([".", "!", "?", ",", ""])


def odd_line(rng: random.Random) -> str:
    """A line mixing both languages with characters and spacing the tokenizers were not trained on."""
    parts = [rng.choice([zh_line, en_line])(rng) for _ in range(rng.randint(1, 3))]
    parts += [rng.choice(_ODD) for _ in range(rng.randint(0, 3))]
    rng.shuffle(parts)
    return rng.choice(["", " ", "  "]).join(parts)


def lines(count: int, seed: int) -> list[str]:
    """`count` test lines: Chinese, English and odd ones in turn."""
    rng = random.Random(seed)
    kinds = [zh_line, en_line, odd_line]
    return [kinds[i % 3](rng) for i in range(count)]


def train_spm(sentences: list[str], size: int, model_type: str = "unigram") -> bytes:
    """A SentencePiece model (unigram as OPUS-MT's, bpe as NLLB's and M2M100's) trained on `sentences`."""
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, vocab_size=size, model_type=model_type,
        character_coverage=0.9995, minloglevel=2, num_threads=1,
    )
    return model.getvalue()


def _marian_vocab(*models: bytes, size: int | None = None, codes: tuple[str, ...] = ()) -> dict[str, int]:
    """As Marian's converter writes it: </s> 0, <unk> 1, target-language tokens (`>>cmn_Hant<<`), the models'
    pieces, <pad> last; `size`: filled up to that many pieces with pieces no model makes (the benchmark's
    65,001)."""
    import sentencepiece

    pieces = ["</s>", "<unk>", *(f">>{code}<<" for code in codes)]
    for proto in models:
        sp = sentencepiece.SentencePieceProcessor(model_proto=proto)
        for i in range(sp.get_piece_size()):
            piece = sp.id_to_piece(i)
            if not (sp.is_control(i) or sp.is_unknown(i)) and piece not in pieces:
                pieces.append(piece)
    pieces += [f"{chr(0x2581)}filler{i}" for i in range((size or 0) - len(pieces) - 1)]
    pieces.append("<pad>")
    return {p: i for i, p in enumerate(pieces)}


def _configs(vocab_size: int, sizes: dict, separate: bool) -> tuple[dict, dict]:
    pad = vocab_size - 1
    config = json.loads((FIXTURES / "opus-mt-zh-en" / "config.json").read_text())
    max_length = MAX_LENGTH if sizes else config["max_length"]
    config.update(sizes, vocab_size=vocab_size, decoder_vocab_size=vocab_size, pad_token_id=pad,
                  share_encoder_decoder_embeddings=not separate,
                  decoder_start_token_id=pad, bad_words_ids=[[pad]], max_length=max_length)
    generation = json.loads((FIXTURES / "opus-mt-zh-en" / "generation_config.json").read_text())
    generation.update(pad_token_id=pad, decoder_start_token_id=pad, bad_words_ids=[[pad]], max_length=max_length)
    return config, generation


def build(folder: pathlib.Path, seed: int = 0, weights: str = "model.safetensors", real_sizes: bool = False,
          separate: bool = False, target_codes: tuple[str, ...] = ()) -> pathlib.Path:
    """Writes the checkpoint folder and returns it.

    Args:
        real_sizes: opus-mt-zh-en's own sizes (65,001 pieces) and transformers' initialisation, not widened
            (bench/import_ctranslate2.py).
        separate: separate source and target vocabularies and embeddings (`separate_vocabs`,
            `share_encoder_decoder_embeddings` false), of one size, as the tc-big OPUS-MT models have.
        target_codes: a multilingual model's target languages (opus-mt-en-zh: `>>cmn_Hans<<`, ...).
    """
    import torch
    from safetensors.torch import save_file
    from transformers import MarianConfig, MarianMTModel

    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    source = train_spm([zh_line(rng) for _ in range(400)], 120)
    target = train_spm([en_line(rng) for _ in range(400)], 150)
    size = 65001 if real_sizes else None
    if separate:  # both filled to one size, so that pad (the last id) is the same on both sides
        widest = max(len(_marian_vocab(source)), len(_marian_vocab(target)))
        vocab, target_vocab = _marian_vocab(source, size=widest), _marian_vocab(target, size=widest)
        (folder / "target_vocab.json").write_text(json.dumps(target_vocab, ensure_ascii=False, indent=2))
    else:
        vocab = _marian_vocab(source, target, size=size, codes=target_codes)
    config, generation = _configs(len(vocab), {} if real_sizes else SIZES, separate)
    (folder / "source.spm").write_bytes(source)
    (folder / "target.spm").write_bytes(target)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=2))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2))
    tokenizer_config = json.loads((FIXTURES / "opus-mt-zh-en" / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, **({"separate_vocabs": True} if separate else {})}))
    torch.manual_seed(seed)
    model = MarianMTModel(MarianConfig.from_dict(config)).eval()
    with torch.no_grad():
        if real_sizes:
            model.final_logits_bias.normal_(0.0, 0.5)
        else:
            _widen(model, config["eos_token_id"])
    # As transformers saves it: no static position tables; tied weights stored once each name.
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items() if "embed_positions" not in k}
    if weights.endswith(".safetensors"):
        save_file(state, str(folder / weights), metadata={"format": "pt"})
    else:
        torch.save(state, folder / weights)
    return folder


def sharpen_cross_attention(model) -> None:
    """Peaked, source-dependent cross-attention of a BART-family model (see SHARPNESS)."""
    for layer in model.model.decoder.layers:
        cross = layer.encoder_attn
        for weight, scale in ((cross.q_proj.weight, SHARPNESS), (cross.k_proj.weight, SHARPNESS),
                              (cross.v_proj.weight, SOURCE_WEIGHT), (cross.out_proj.weight, SOURCE_WEIGHT)):
            weight.mul_(scale)


def _widen(model, eos: int) -> None:
    """Peaked, source-dependent attention and outputs of a few tokens (see SHARPNESS)."""
    sharpen_cross_attention(model)
    model.model.decoder.layers[-1].final_layer_norm.weight.mul_(LOGIT_SCALE)
    model.final_logits_bias.normal_(0.0, 0.5)
    model.final_logits_bias[0, eos] += EOS_BIAS


def transformers_model(folder: pathlib.Path):
    """The checkpoint as transformers loads it from the folder (eager attention), for comparisons."""
    from transformers import MarianMTModel

    return MarianMTModel.from_pretrained(str(folder), attn_implementation="eager", local_files_only=True).eval()


def transformers_tokenizer(folder: pathlib.Path):
    from transformers import MarianTokenizer

    return MarianTokenizer.from_pretrained(str(folder), local_files_only=True)
