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

Version 1's name words rarely looked at their object (42% of the time): every cell's features, after the grid
convolutions, see the whole frame, so any cell told the speller which object was there, and the names read
mostly one column of the grid wherever the object was. Version 2 (`local_keys`, no `key_positions`) keys the
attention on each cell as the last stage sees it (a 21-pixel view) plus the frame's BiLSTM state, without
positions, and trains the presence head on what each name word's attention gathers of those local cells
(train.py's grounding loss): a name's attention must land where its object can be seen. The values keep the
whole-frame view. Two variants that did not help are kept as options for the record: `spatial_keys` (keys
without the BiLSTM state: verbs lost their frames) and `fine_grid` (the image captioner's 12 x 12 grid).

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
    # The attention keys read the cells alone (with their positions), the BiLSTM's state going only into the
    # values: a frame-wide term in every key of a frame could let a name match any cell of the right frame.
    spatial_keys: bool = False
    # The image captioner's `fine_grid`: cells of half the side (12 x 12 at 48 pixels), for pointing.
    fine_grid: bool = False
    # The attention keys read each cell as the last stage sees it (before the grid convolutions, whose view
    # spans the whole frame: a 21-pixel view at 48 pixels), with its position and the frame's BiLSTM state;
    # the values keep the whole-frame view. The presence head reads these local cells too.
    local_keys: bool = False
    # With local_keys: the keys carry the cells' position embeddings. Without them a key can only say what a
    # cell shows (and when), so no cell can become the place every name word reads from (version 1's names
    # mostly looked at one column of the grid, wherever the object was).
    key_positions: bool = True

    def __post_init__(self):
        if self.local_keys and (self.fine_grid or self.spatial_keys):
            raise ValueError("local_keys replaces the keys: it goes with neither fine_grid nor spatial_keys")
        if not self.key_positions and not self.local_keys:
            raise ValueError("key_positions=False needs local_keys (the other keys read the cells with positions)")

    def frame_config(self) -> ShowAttendTellConfig:
        """The image captioner's config for the per-frame encoder and the speller."""
        return ShowAttendTellConfig(
            vocab_size=self.vocab_size, image_size=self.frame_size, stem=self.stem, stages=self.stages,
            grid_convs=self.grid_convs, feature_dim=self.feature_dim, embed_dim=self.embed_dim,
            decoder_hidden=self.decoder_hidden, attention_dim=self.attention_dim, dropout=self.dropout,
            mean=self.mean, std=self.std, max_words=self.max_words, objects=self.objects,
            fine_grid=self.fine_grid)

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
        if cfg.local_keys:  # the last stage's channels -> the feature width
            self.local = nn.Linear((cfg.stem, *cfg.stages)[-1], cfg.feature_dim)
        self.presence = nn.Linear(cfg.feature_dim, cfg.objects)  # training only; not exported
        self.action = nn.Linear(2 * cfg.temporal_hidden, 1)  # training only; not exported

    def features(self, pixels: torch.Tensor):
        """(B, T, 3, H, W) -> memory (B, T*G, D), its keys (B, T*G, A), plain cells (B, T, G, D), BiLSTM
        states (B, T, 2H), and what the presence head reads (B, T, G, D)."""
        b, t = pixels.shape[0], pixels.shape[1]
        with_position, plain, local = (x.unflatten(0, (b, t)) if x is not None else None
                                       for x in self.frame_cells(pixels.flatten(0, 1)))  # (B, T, G, D) each
        when, states = self.temporal(with_position)
        memory = (with_position + when[:, :, None, :]).flatten(1, 2)  # (B, T*G, D), frame-major
        if local is not None:
            where = self.frame_encoder.position if self.cfg.key_positions else 0.0
            source = (local + where + when[:, :, None, :]).flatten(1, 2)
        else:
            source = with_position.flatten(1, 2) if self.cfg.spatial_keys else memory
        return memory, self.speller.attention.keys(source), plain, states, plain if local is None else local

    def frame_cells(self, frames: torch.Tensor):
        """(N, 3, H, W) -> cells with positions, without (N, G, D), and with `local_keys` the local cells (N, G, D)
        (else None)."""
        if not self.cfg.local_keys:
            return *self.frame_encoder(frames), None
        net = self.frame_encoder.net
        last_stage = 3 + 4 * len(self.cfg.stages)  # the stem's and each stage's layers (export/image/model.py)
        early = net[:last_stage](frames)  # (N, C, g, g)
        plain = net[last_stage:](early).flatten(2).transpose(1, 2)  # (N, G, D)
        local = torch.relu(self.local(early.flatten(2).transpose(1, 2)))  # (N, G, D)
        return plain + self.frame_encoder.position, plain, local

    def encode(self, pixels: torch.Tensor):
        """(B, T, 3, H, W) normalised frames -> memory (B, T*G, D), keys (B, T*G, A), h0 and c0 (B, Hd)."""
        memory, keys, plain, _, _ = self.features(pixels)
        h, c = self.speller.initial_state(plain.mean((1, 2)))
        return memory, keys, h, c

    def forward(self, pixels: torch.Tensor, tgt_in: torch.Tensor):
        """Teacher-forced pass: logits (B, U, V), attention (B, U, T*G), presence logits (B, T, objects), action
        logits (B, T), and the presence head on what each word's attention gathers of the cells the presence
        head reads (B, U, objects): a name word's attention should gather its object."""
        memory, keys, plain, states, seen = self.features(pixels)
        h, c = self.speller.initial_state(plain.mean((1, 2)))
        presence = self.presence(seen).amax(2)  # (B, T, objects): each object's best cell in each frame
        action = self.action(states)[..., 0]  # (B, T)
        logits, weights = self.speller.teacher_forced(tgt_in, h, c, memory, keys)
        gathered = self.presence(weights @ seen.flatten(1, 2))  # (B, U, objects)
        return logits, weights, presence, action, gathered

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
