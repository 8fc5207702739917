"""A tiny ViT + GPT-2 captioner checkpoint folder built here: the published nlpconnect/vit-gpt2-image-captioning
config.json, preprocessor_config.json and tokenizer_config.json (tests/fixtures/hf/vit-gpt2-image-captioning,
written from knowledge of them: see its README) with only the sizes changed (the 224-pixel input and 16-pixel
patches kept: a 14 x 14 grid plus the class token), a byte-level BPE trained on a few hundred generated lines
with <|endoftext|> last (GPT-2's layout), and random weights widened so that cross-attention is peaked and
outputs depend on the image. Test images are drawn here too (coloured rectangles on noise).

No hub access: nothing is downloaded, everything is made from the fixtures and a seed.
"""

from __future__ import annotations

import io
import json
import pathlib
import random

import numpy as np

import tiny_marian

FIXTURE = tiny_marian.FIXTURES / "vit-gpt2-image-captioning"
VIT_SIZES = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}
GPT2_SIZES = {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64, "n_ctx": 64}
VOCAB = 400
EOT = "<|endoftext|>"
SHARPNESS, SOURCE_WEIGHT = 25.0, 6.0  # cross-attention q/k and v/out gains: peaked, image-dependent
LOGIT_SCALE = 3.0  # ln_f's gain: logits of a few units
# Each position's row moves this much further along <|endoftext|>'s direction: captions end, at lengths the
# image decides (0-11 tokens on 8 pictures; without it, tied embeddings never end or end at once).
EOS_RAMP = 0.1


def _tokenizer(folder: pathlib.Path, seed: int, size: int = VOCAB) -> int:
    """GPT-2-style tokenizer.json (byte-level BPE, <|endoftext|> last, padded with unused added tokens up to
    `size`); returns its id."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    rng = random.Random(seed)
    lines = [tiny_marian.en_line(rng) for _ in range(600)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 1, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(lines, trainer)
    tok.add_tokens([f"<unused{i}>" for i in range(size - 1 - tok.get_vocab_size())])
    tok.add_special_tokens([AddedToken(EOT, special=True)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text((FIXTURE / "tokenizer_config.json").read_text())
    return tok.token_to_id(EOT)


def build(folder: pathlib.Path, seed: int = 0, real_sizes: bool = False) -> pathlib.Path:
    """Writes the checkpoint folder and returns it.

    Args:
        real_sizes: keep the published sizes (ViT-base, GPT-2 124M, 50,257 tokens: the trained pieces padded
            with unused ones) for bench/import_vit_gpt2.py; the weights are random either way.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import VisionEncoderDecoderConfig, VisionEncoderDecoderModel

    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads((FIXTURE / "config.json").read_text())
    eot = _tokenizer(folder, seed, config["decoder"]["vocab_size"] if real_sizes else VOCAB)
    if not real_sizes:
        config["encoder"].update(VIT_SIZES)
        config["decoder"].update(GPT2_SIZES)
    config["decoder"].update(vocab_size=eot + 1, bos_token_id=eot, eos_token_id=eot)
    config.update(bos_token_id=eot, eos_token_id=eot, pad_token_id=eot, decoder_start_token_id=eot)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "preprocessor_config.json").write_text((FIXTURE / "preprocessor_config.json").read_text())
    torch.manual_seed(seed)
    model = VisionEncoderDecoderModel(config=VisionEncoderDecoderConfig.from_dict(config)).eval()
    with torch.no_grad():
        _widen(model, eot, sharpness=1.0 if real_sizes else SHARPNESS)
    # As transformers 4 saved it (the published checkpoint's era): GPT-2's lm_head tied to its wte and not
    # written, and each attention's causal-mask buffers written with the weights.
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items() if k != "decoder.lm_head.weight"}
    n = config["decoder"]["n_positions"]
    causal = torch.tril(torch.ones(n, n, dtype=torch.uint8))[None, None]
    for i in range(config["decoder"]["n_layer"]):
        for attention in ("attn", "crossattention"):
            state[f"decoder.transformer.h.{i}.{attention}.bias"] = causal.clone()
            state[f"decoder.transformer.h.{i}.{attention}.masked_bias"] = torch.tensor(-1e4)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def _widen(model, eos: int, sharpness: float = SHARPNESS) -> None:
    """Peaked, image-dependent cross-attention; logits of a few units; a growing pull towards <|endoftext|>.

    Args:
        sharpness: the cross-attention q/k gain. At the real width (768) random projections already give
            scores of several units, and x25 makes the attention so steep that float rounding flips outputs
            (6 of 16 captions differed between two float32 implementations), so real sizes keep 1.
    """
    import torch

    gpt = model.decoder.transformer
    d = model.config.decoder.n_embd
    for block in gpt.h:
        cross = block.crossattention
        cross.q_attn.weight.mul_(sharpness)
        cross.c_attn.weight[:, :d].mul_(sharpness)  # Conv1D (in, out): keys, then values
        cross.c_attn.weight[:, d:].mul_(SOURCE_WEIGHT)
        cross.c_proj.weight.mul_(SOURCE_WEIGHT)
    gpt.ln_f.weight.mul_(LOGIT_SCALE)
    towards_eos = gpt.wte.weight[eos] / gpt.wte.weight[eos].norm()
    positions = torch.arange(gpt.wpe.weight.shape[0], dtype=torch.float32)[:, None]
    gpt.wpe.weight.add_(EOS_RAMP * positions * towards_eos)


def image(seed: int, width: int = 160, height: int = 120, kind: str = "PNG") -> bytes:
    """A test picture: a few coloured rectangles on noise, as PNG or JPEG bytes."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    picture = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    draw = ImageDraw.Draw(picture)
    for _ in range(3):
        x0, y0 = int(rng.integers(0, width - 8)), int(rng.integers(0, height - 8))
        x1, y1 = x0 + int(rng.integers(8, width // 2)), y0 + int(rng.integers(8, height // 2))
        draw.rectangle([x0, y0, x1, y1], fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    out = io.BytesIO()
    picture.save(out, kind, **({"quality": 90} if kind == "JPEG" else {}))
    return out.getvalue()


def transformers_model(folder: pathlib.Path):
    from transformers import VisionEncoderDecoderModel

    return VisionEncoderDecoderModel.from_pretrained(str(folder), attn_implementation="eager",
                                                     local_files_only=True).eval()


def transformers_processor(folder: pathlib.Path):
    """The checkpoint's image processor: transformers' Pillow ViTImageProcessor (no torchvision here)."""
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    return ViTImageProcessorPil.from_pretrained(str(folder), local_files_only=True)


def transformers_tokenizer(folder: pathlib.Path):
    from transformers import GPT2Tokenizer

    return GPT2Tokenizer.from_pretrained(str(folder), local_files_only=True)
