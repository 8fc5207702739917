"""Show, attend and tell (Xu et al. 2015): a convolutional `Encoder` giving a grid of features, and an LSTM
`Speller` that attends over the grid once per word.

The Encoder is a small VGG-style network sized for CPU training: a stride-2 3x3 convolution (the stem),
then one 3x3 convolution (batch-normalised, ReLU) and a 2x2 max-pool per stage, so a 64 x 64 image becomes
an 8 x 8 grid, then two 3x3 convolutions at the grid's resolution that widen every cell's view to its
neighbours (an object spans several cells). Each cell's
feature vector is one encoder position, row by row: the attention columns of docs/model-contract.md's image
kind. A learned embedding of each cell's position is added to its features, so that what the Speller reads
through attention says *where* as well as *what* ("to the left of" needs both).

The Speller follows the paper's soft attention: at each step the previous hidden state queries the grid with
an additive score (export/common/recurrent_layers.py's `AdditiveAttention`, the keys W_k a_i projected once
per image), a gate beta = sigmoid(f(h)) scales the context, the LSTM reads the previous word and the gated context, and
the word comes from the deep output layer L_o(E y + L_h h + L_z z). Its initial h and c come from the mean of
the grid features *without* their position embeddings: the Speller starts knowing which objects are there,
but must look to learn where, and in which order to name them. Its state (h, c) is replaced every step, the
contract's `replace` decoder state; the step's attention weights are the served attention row of the word
the step writes.

Training adds the paper's doubly stochastic regulariser, lambda * sum_i (1 - sum_t alpha_ti)^2, which asks
every cell to be looked at about once over the caption, and a training-only presence head (not exported):
per cell, a score for each object; its maximum over the cells is trained to say which objects the caption
names (multiple-instance learning, the caption's words as the only labels, no boxes). Without it the
convolutions learned no object after an epoch on the CPU (the caption loss reaches them only through the
mean cell and soft attention), and the attention settled on background cells; with it every cell's features
say what is in it, which is what content-based attention needs to find the object a word names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import nn

from attnserve.export.common.recurrent_layers import AdditiveAttention, greedy_search
from attnserve.export.image import vocabulary
from attnserve.export.image.objects import OBJECTS


@dataclasses.dataclass(frozen=True)
class ShowAttendTellConfig:
    # Output words + the four specials (export/image/vocabulary.py).
    vocab_size: int = len(vocabulary.SPECIAL_TOKENS) + len(vocabulary.caption_words())
    # Side of the square RGB input, in pixels.
    image_size: int = 64
    # Channels of the stem, a stride-2 3x3 convolution (64 -> 32 pixels: the cheap way to halve the side).
    stem: int = 24
    # Channels of each later stage, a 3x3 convolution and a 2x2 max-pool (32 -> 8 with two).
    stages: tuple[int, ...] = (32, 64)
    # 3x3 convolutions after the last pool, at the grid's resolution.
    grid_convs: int = 2
    # Width of a grid cell's feature vector (the attention memory).
    feature_dim: int = 128
    # Word embedding width.
    embed_dim: int = 64
    # Units of the speller's LSTM cell.
    decoder_hidden: int = 256
    # Width of the additive attention's score space.
    attention_dim: int = 128
    dropout: float = 0.1
    # The normalisation the server applies (manifest input.normalize): pixel / 255, minus mean, over std.
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.25, 0.25, 0.25)
    # Longest caption the exporter advertises (words, EOS excluded).
    max_words: int = 16
    # Objects the training-only presence head tells apart (export/image/objects.py).
    objects: int = len(OBJECTS)
    # Attend over a grid twice as fine as the deep features (16 x 16 at 64 pixels with two stages): the deep
    # features, upsampled, are joined with the last stage's input (the previous stage's finer output), so
    # captions keep the deep view while the attention can point at a quarter of a coarse cell.
    fine_grid: bool = False

    def __post_init__(self):
        if self.image_size % self.reduction:
            raise ValueError(
                f"image_size {self.image_size} is not divisible by the encoder's {self.reduction}x reduction"
            )
        if self.vocab_size <= vocabulary.START_ID:
            raise ValueError(f"vocab_size {self.vocab_size} leaves no room for the specials")

    @property
    def reduction(self) -> int:
        """Input pixels per grid cell, along each side."""
        return 2 ** (1 + len(self.stages))

    @property
    def grid(self) -> int:
        """Cells per side of the encoder's grid."""
        return self.image_size // self.reduction * (2 if self.fine_grid else 1)


def grid_sinusoids(grid: int, dim: int) -> torch.Tensor:
    """(grid², dim) unit-variance 2-D sinusoid codes of the cells, row by row."""
    half = dim // 2
    rate = torch.exp(torch.arange(0, half, 2) * (-torch.log(torch.tensor(100.0)) / half))  # (half / 2,)
    where = torch.arange(grid, dtype=torch.float32)[:, None] * rate  # (grid, half / 2)
    axis = torch.cat([where.sin(), where.cos()], dim=1)  # (grid, half)
    rows, cols = axis[:, None, :].expand(grid, grid, half), axis[None, :, :].expand(grid, grid, half)
    return torch.cat([rows, cols], dim=2).reshape(grid * grid, 2 * half) * 2**0.5


def _conv(c_in: int, c_out: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, 3, stride, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]


class Encoder(nn.Module):
    """(B, 3, H, W) normalised pixels -> (B, S, D) cell features with positions, and (B, S, D) without, S = grid²."""

    def __init__(self, cfg: ShowAttendTellConfig):
        super().__init__()
        widths = (cfg.stem, *cfg.stages)
        stages = [[*_conv(c_in, c_out), nn.MaxPool2d(2)] for c_in, c_out in zip(widths, widths[1:])]
        grid_convs = [m for _ in range(cfg.grid_convs) for m in _conv(widths[-1], widths[-1])]
        project = [nn.Conv2d(widths[-1], cfg.feature_dim, 1), nn.ReLU(inplace=True)]
        stem = _conv(3, cfg.stem, stride=2)
        if cfg.fine_grid:  # up to the finer output; the last stage and grid convolutions; the joined grid
            self.early = nn.Sequential(*stem, *[m for stage in stages[:-1] for m in stage])
            self.deep = nn.Sequential(*stages[-1], *grid_convs)
            self.upsample = nn.Upsample(scale_factor=2, mode="nearest")
            self.net = nn.Sequential(*_conv(widths[-1] + widths[-2], widths[-1]), *project)
        else:
            self.net = nn.Sequential(*stem, *[m for stage in stages for m in stage], *grid_convs, *project)
        self.fine_grid = cfg.fine_grid
        # Learned per cell; on the fine grid they start as 2-D sinusoids (rows in one half of the features,
        # columns in the other): four times as many cells would otherwise learn where they are four times slower.
        start = grid_sinusoids(cfg.grid, cfg.feature_dim) if cfg.fine_grid else torch.randn(cfg.grid**2, cfg.feature_dim)
        self.position = nn.Parameter(start * 0.1)  # (S, D)

    def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fine_grid:
            fine = self.early(pixels)  # (B, C, 2g, 2g)
            x = self.net(torch.cat([self.upsample(self.deep(fine)), fine], dim=1))  # (B, D, 2g, 2g)
        else:
            x = self.net(pixels)  # (B, D, g, g)
        x = x.flatten(2).transpose(1, 2)  # (B, S, D), row by row
        return x + self.position, x


class Speller(nn.Module):
    """An LSTM cell with gated soft attention over the grid and a deep output layer; `step()` is the decoder."""

    def __init__(self, cfg: ShowAttendTellConfig):
        super().__init__()
        d, h = cfg.feature_dim, cfg.decoder_hidden
        self.embed = nn.Embedding(cfg.vocab_size, cfg.embed_dim)
        self.attention = AdditiveAttention(h, d, cfg.attention_dim)
        self.gate = nn.Linear(h, 1)
        self.cell = nn.LSTMCell(cfg.embed_dim + d, h)
        self.init_proj = nn.Linear(d, 2 * h)
        self.out_h = nn.Linear(h, cfg.embed_dim)
        self.out_z = nn.Linear(d, cfg.embed_dim, bias=False)
        self.out = nn.Linear(cfg.embed_dim, cfg.vocab_size)
        self.dropout = nn.Dropout(cfg.dropout)

    def initial_state(self, mean: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h0, c0 (B, Hd) from the mean cell feature (B, D)."""
        h, c = torch.tanh(self.init_proj(mean)).split(self.cell.hidden_size, dim=-1)
        return h, c

    def step(self, ids, h, c, memory, keys):
        """One word for every row.

        Args:
            ids: (B,) the previous word.
            h, c: (B, Hd) LSTM state.
            memory: (B, S, D) cell features; keys: (B, S, A) their score-space projection.

        Returns:
            logits (B, V), new h and c, and the attention weights (B, S) this word was written with.
        """
        weights = self.attention.scores(h, keys).softmax(dim=-1)  # (B, S)
        context = (weights[:, None, :] @ memory)[:, 0] * torch.sigmoid(self.gate(h))  # (B, D)
        embedded = self.embed(ids)  # (B, E)
        h, c = self.cell(torch.cat([embedded, context], dim=-1), (h, c))
        deep = torch.tanh(embedded + self.out_h(self.dropout(h)) + self.out_z(context))
        return self.out(self.dropout(deep)), h, c, weights

    def teacher_forced(self, tgt_in, h, c, memory, keys) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, U) start token + words -> logits (B, U, V) and the attention (B, U, S) of each word."""
        logits, weights = [], []
        for u in range(tgt_in.shape[1]):
            step_logits, h, c, step_weights = self.step(tgt_in[:, u], h, c, memory, keys)
            logits.append(step_logits)
            weights.append(step_weights)
        return torch.stack(logits, dim=1), torch.stack(weights, dim=1)

    def greedy(self, memory, keys, h, c, max_new_tokens: int, suppress_ids: Sequence[int]):
        """Reference greedy search (PyTorch, batch-synchronous) from the encoder's outputs, for parity tests
        and evaluation: per row the generated ids (EOS excluded) and a (words, S) attention tensor."""
        state = [h, c]

        def step(ids):
            logits, state[0], state[1], weights = self.step(ids, *state, memory, keys)
            return logits, weights

        start = torch.full((memory.shape[0],), vocabulary.START_ID)
        outputs, attentions = greedy_search(step, start, vocabulary.EOS_ID, max_new_tokens, suppress_ids)
        return outputs, [torch.stack(a) if a else torch.zeros(0, memory.shape[1]) for a in attentions]


class ShowAttendTell(nn.Module):
    # The family name its checkpoints record (common/training.py).
    ARCH = "show-attend-tell"

    def __init__(self, cfg: ShowAttendTellConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.speller = Speller(cfg)
        self.presence = nn.Linear(cfg.feature_dim, cfg.objects)  # training only; not exported

    def encode(self, pixels: torch.Tensor):
        """(B, 3, H, W) normalised pixels -> memory (B, S, D), keys (B, S, A), h0 and c0 (B, Hd)."""
        memory, features = self.encoder(pixels)
        keys = self.speller.attention.keys(memory)
        h, c = self.speller.initial_state(features.mean(1))
        return memory, keys, h, c

    def forward(self, pixels: torch.Tensor, tgt_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Teacher-forced pass: (B, 3, H, W) pixels, (B, U) start token + words -> logits (B, U, V), the
        attention (B, U, S) and the presence logits (B, objects): each object's best cell score."""
        memory, features = self.encoder(pixels)
        keys = self.speller.attention.keys(memory)
        h, c = self.speller.initial_state(features.mean(1))
        presence = self.presence(features).amax(1)  # (B, objects)
        logits, weights = self.speller.teacher_forced(tgt_in, h, c, memory, keys)
        return logits, weights, presence

    @torch.no_grad()
    def greedy_decode(self, pixels: torch.Tensor, max_new_tokens: int | None = None,
                      suppress_ids: Sequence[int] = tuple(vocabulary.suppressed_ids())):
        """Reference greedy search (PyTorch, batch-synchronous) for parity tests and evaluation.

        Returns per row the generated ids (EOS excluded) and a (words, S) attention tensor.
        """
        memory, keys, h, c = self.encode(pixels)
        return self.speller.greedy(memory, keys, h, c, max_new_tokens or self.cfg.max_words, suppress_ids)


def normalize(images: torch.Tensor, cfg: ShowAttendTellConfig) -> torch.Tensor:
    """(B, H, W, 3) uint8 -> (B, 3, H, W) float32, as the server normalises (server/inputs/image.py)."""
    x = images.permute(0, 3, 1, 2).float() / 255.0
    mean = torch.tensor(cfg.mean).view(1, 3, 1, 1)
    std = torch.tensor(cfg.std).view(1, 3, 1, 1)
    return (x - mean) / std
