"""Show, attend and tell in time: a clip captioner that attends over (frame, cell) positions.

  FrameEncoder  the image captioner's convolutional `Encoder` (export/image/model.py) run on every frame:
                a grid of cell features per frame, with a learned embedding of each cell's position;
  Temporal      a BiLSTM over the frames. Each frame is summarised by a linear map of its whole grid (so the
                summary keeps *where* things are, which "from left to right" needs) joined with its change
                since the previous frame (what moved); the BiLSTM's state at frame t, projected, is added to
                every cell of frame t, so a cell's memory says what is there, where, and what happens then;
  Speller       the image captioner's LSTM speller unchanged: additive attention over all T x G positions,
                frame-major (position t * G + g is cell g of frame t), the gated context, a deep output layer.

The speller's first h and c come from the mean cell feature without positions or time, as in the image
model: it starts knowing which objects are there and must look to learn what they do and when.

Two training-only heads (not exported) give the features a direct signal, as the image model's presence head
does: per cell, a score for each object, its maximum over each frame's cells trained to say which objects
that frame shows (the clip generator knows when each object is visible, never where it is: no box reaches
training); and per frame, from the BiLSTM's state, whether an action is under way (the clip
generator's action windows). The speller then finds objects and actions by content.

Nothing fixes the number of frames: the frame axis is dynamic in the exported encoder (docs/model-contract.md,
video input), and every frame of a batch row is real (the server samples the same count from every clip).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from attnserve.export.image.model import Encoder, ShowAttendTellConfig, Speller
from attnserve.export.video import vocabulary
from attnserve.export.video.clips import FRAMES, OBJECT_SET


@dataclasses.dataclass(frozen=True)
class VideoCaptionerConfig:
    # Output words + the four specials (export/video/vocabulary.py).
    vocab_size: int = len(vocabulary.SPECIAL_TOKENS) + len(vocabulary.caption_words())
    # Side of each square RGB frame, in pixels, and the frames a clip is sampled to.
    frame_size: int = 48
    frames: int = FRAMES
    # The per-frame CNN (export/image/model.py's Encoder): stem channels, conv + max-pool stages, grid convs.
    stem: int = 16
    stages: tuple[int, ...] = (24, 48)
    grid_convs: int = 2
    # Width of a (frame, cell) feature vector: the attention memory.
    feature_dim: int = 64
    # A frame's summary fed to the BiLSTM, and the BiLSTM's units per direction.
    summary_dim: int = 96
    temporal_hidden: int = 64
    embed_dim: int = 48
    decoder_hidden: int = 192
    attention_dim: int = 64
    dropout: float = 0.1
    # The normalisation the server applies (manifest input.normalize).
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.25, 0.25, 0.25)
    max_words: int = 12
    # Objects the training-only presence head tells apart.
    objects: int = len(OBJECT_SET)

    def frame_config(self) -> ShowAttendTellConfig:
        """The image captioner's config for the per-frame encoder and the speller."""
        return ShowAttendTellConfig(
            vocab_size=self.vocab_size, image_size=self.frame_size, stem=self.stem, stages=self.stages,
            grid_convs=self.grid_convs, feature_dim=self.feature_dim, embed_dim=self.embed_dim,
            decoder_hidden=self.decoder_hidden, attention_dim=self.attention_dim, dropout=self.dropout,
            mean=self.mean, std=self.std, max_words=self.max_words, objects=self.objects)

    @property
    def grid(self) -> int:
        """Cells per side of a frame's grid."""
        return self.frame_config().grid


class Temporal(nn.Module):
    """(B, T, G, D) cell features -> (B, T, D) what happens at each frame (BiLSTM over frame summaries).

    The BiLSTM is two LSTMs, the backward one reading the frames reversed: the exporter writes PyTorch's
    bidirectional LSTM with the export example's batch and frame counts fixed in its output's reshape.
    """

    def __init__(self, cfg: VideoCaptionerConfig):
        super().__init__()
        if 2 * cfg.summary_dim < cfg.temporal_hidden:
            raise ValueError("summary_dim must be at least half of temporal_hidden (the LSTMs' first state)")
        self.summary = nn.Linear(cfg.grid**2 * cfg.feature_dim, cfg.summary_dim)
        self.forward_lstm = nn.LSTM(2 * cfg.summary_dim, cfg.temporal_hidden, batch_first=True)
        self.backward_lstm = nn.LSTM(2 * cfg.summary_dim, cfg.temporal_hidden, batch_first=True)
        self.project = nn.Linear(2 * cfg.temporal_hidden, cfg.feature_dim)

    def forward(self, cells: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns the per-frame features added to the cells (B, T, D) and the BiLSTM states (B, T, 2H)."""
        s = torch.relu(self.summary(cells.flatten(2)))  # (B, T, Ds)
        change = s - torch.cat([s[:, :1], s[:, :-1]], dim=1)  # (B, T, Ds): 0 at the first frame
        x = torch.cat([s, change], dim=-1)  # (B, T, 2Ds)
        # The first state as zeros computed from the data: zeros made from a size (the LSTM's own, zeros_like,
        # new_zeros) are traced with the export example's batch fixed in the graph.
        zeros = (x[:, 0, : self.forward_lstm.hidden_size] * 0)[None]  # (1, B, H)
        ahead, _ = self.forward_lstm(x, (zeros, zeros))  # (B, T, H)
        behind, _ = self.backward_lstm(x.flip(1), (zeros, zeros))
        states = torch.cat([ahead, behind.flip(1)], dim=-1)  # (B, T, 2H)
        return self.project(states), states


class VideoShowAttendTell(nn.Module):
    # The family name its checkpoints record (common/training.py).
    ARCH = "show-attend-tell-video"

    def __init__(self, cfg: VideoCaptionerConfig):
        super().__init__()
        self.cfg = cfg
        frame_cfg = cfg.frame_config()
        self.frame_encoder = Encoder(frame_cfg)
        self.temporal = Temporal(cfg)
        self.speller = Speller(frame_cfg)
        self.presence = nn.Linear(cfg.feature_dim, cfg.objects)  # training only; not exported
        self.action = nn.Linear(2 * cfg.temporal_hidden, 1)  # training only; not exported

    def features(self, pixels: torch.Tensor):
        """(B, T, 3, H, W) -> memory (B, T*G, D), plain cells (B, T, G, D), BiLSTM states (B, T, 2H)."""
        b, t = pixels.shape[0], pixels.shape[1]
        with_position, plain = self.frame_encoder(pixels.flatten(0, 1))  # (B*T, G, D) each
        cells = with_position.unflatten(0, (b, t))  # (B, T, G, D)
        plain = plain.unflatten(0, (b, t))
        when, states = self.temporal(cells)
        memory = (cells + when[:, :, None, :]).flatten(1, 2)  # (B, T*G, D), frame-major
        return memory, plain, states

    def encode(self, pixels: torch.Tensor):
        """(B, T, 3, H, W) normalised frames -> memory (B, T*G, D), keys (B, T*G, A), h0 and c0 (B, Hd)."""
        memory, plain, _ = self.features(pixels)
        keys = self.speller.attention.keys(memory)
        h, c = self.speller.initial_state(plain.mean((1, 2)))
        return memory, keys, h, c

    def forward(self, pixels: torch.Tensor, tgt_in: torch.Tensor):
        """Teacher-forced pass: logits (B, U, V), attention (B, U, T*G), presence logits (B, T, objects) and
        action logits (B, T)."""
        memory, plain, states = self.features(pixels)
        keys = self.speller.attention.keys(memory)
        h, c = self.speller.initial_state(plain.mean((1, 2)))
        presence = self.presence(plain).amax(2)  # (B, T, objects): each object's best cell in each frame
        action = self.action(states)[..., 0]  # (B, T)
        logits, weights = self.speller.teacher_forced(tgt_in, h, c, memory, keys)
        return logits, weights, presence, action

    @torch.no_grad()
    def greedy_decode(self, pixels: torch.Tensor, max_new_tokens: int | None = None,
                      suppress_ids=tuple(vocabulary.suppressed_ids())):
        """Reference greedy search: per row the ids (EOS excluded) and a (words, T*G) attention tensor."""
        memory, keys, h, c = self.encode(pixels)
        return self.speller.greedy(memory, keys, h, c, max_new_tokens or self.cfg.max_words, suppress_ids)


def normalize(frames: torch.Tensor, cfg: VideoCaptionerConfig) -> torch.Tensor:
    """(B, T, H, W, 3) uint8 -> (B, T, 3, H, W) float32, as the server normalises (server/inputs/video.py)."""
    x = frames.permute(0, 1, 4, 2, 3).float() / 255.0
    mean = torch.tensor(cfg.mean).view(1, 1, 3, 1, 1)
    std = torch.tensor(cfg.std).view(1, 1, 3, 1, 1)
    return (x - mean) / std
