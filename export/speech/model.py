"""Listen, attend and spell (Chan et al. 2015): a pyramid BiLSTM `Listener` and an attentional LSTM `Speller`.

The Listener reads log-mel frames (server/inputs/features.py) with a bidirectional LSTM, then `pyramid_layers`
pyramid BiLSTMs, each of which concatenates neighbouring pairs of the layer below and so halves time:
3 pyramid layers turn 100 frames/s into 12.5 positions/s (8x, 80 ms per attention column). A CTC head
(training only) reads the layer with 4x reduction: 8x leaves too few frames for fast speech's characters,
and the joint CTC-attention loss (Kim et al. 2017) is what makes the attention learn to align in minutes
on a CPU (measured here: pure attention had not aligned after 13 minutes).

The Speller is one LSTM cell; per output character it updates its state from the previous character and
attention context, queries the listener states with a location-aware additive score (Chorowski et al.
2015: Bahdanau's content term, the listener keys W_k h_j computed once per clip, plus convolution features
of the previous step's attention weights, which push the attention forward monotonically; content-only
attention had not learned to align after an hour of CPU training here), and predicts the character from
its state and the new context through a small MLP. Its state (h, c, context, previous attention) is
replaced every step, which is exactly the contract's `replace` decoder state; the previous attention runs
along the source axis (docs/model-contract.md, the LSTM speller example).

Padding never reaches a real frame: features are normalised per clip over its real frames only, the
backward LSTMs read each row reversed within its own length (export/common/recurrent_layers.py), and every layer's
output is zeroed on padding before pairs are concatenated. A clip gives the same states alone or in a
padded batch, and training keeps fast padded batches (packed LSTMs train ~50x slower on CPU).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch
from torch import nn

from attnserve.export.common.recurrent_layers import AdditiveAttention, greedy_search, reverse_within_length
from attnserve.export.speech import vocabulary


@dataclasses.dataclass(frozen=True)
class ListenAttendSpellConfig:
    # Output units (characters + specials, export/speech/vocabulary.py).
    vocab_size: int = len(vocabulary.SPECIAL_TOKENS) + len(vocabulary.CHARACTERS)
    # Log-mel bands per frame.
    n_mels: int = 80
    # Units of each LSTM direction in every listener layer.
    listener_hidden: int = 256
    # Neighbouring frames stacked side by side before the first BiLSTM (1: none). Stacking 4 runs every
    # LSTM at 25 steps/s instead of 100: the listener trains ~3x faster on a CPU (Sak et al. 2015's low
    # frame rate), and the backward pass has a quarter of the sequential steps.
    stack_frames: int = 1
    # BiLSTMs at the stacked frame rate before the pyramid.
    bottom_layers: int = 1
    # Pyramid layers after the first BiLSTM; each halves time, so the reduction is 2 ** pyramid_layers.
    pyramid_layers: int = 3
    # The CTC head reads the listener after this many pyramid layers (2 with stack_frames 1: 4x reduction).
    ctc_layer: int = 2
    # Units of the speller's LSTM cell.
    speller_hidden: int = 320
    # Character embedding width.
    embed_dim: int = 64
    # Width of the additive attention's score space.
    attention_dim: int = 256
    # Location-aware attention: filters and width (in attention columns, odd) of the convolution over the
    # previous step's weights.
    location_filters: int = 10
    location_kernel: int = 31
    dropout: float = 0.2
    # Log-mel values below this are raised to it: synthesizers' silence ranges from digital zero (the
    # features' log floor, -23) to noise (about -10), a difference a recognizer should not learn.
    feature_floor: float = -11.5

    def __post_init__(self):
        if self.stack_frames < 1 or self.bottom_layers < 1:
            raise ValueError(f"stack_frames and bottom_layers must be >= 1, got {self.stack_frames}, {self.bottom_layers}")
        if not 0 <= self.ctc_layer <= self.pyramid_layers:
            raise ValueError(f"ctc_layer {self.ctc_layer} must be in 0..pyramid_layers ({self.pyramid_layers})")
        if self.location_kernel % 2 == 0:
            raise ValueError(f"location_kernel must be odd (centred on each column), got {self.location_kernel}")
        if self.vocab_size <= vocabulary.START_ID:
            raise ValueError(f"vocab_size {self.vocab_size} leaves no room for the {len(vocabulary.SPECIAL_TOKENS)} specials")

    @property
    def time_reduction(self) -> int:
        """Frames per listener output position (attention column)."""
        return self.stack_frames * 2**self.pyramid_layers

    @property
    def ctc_reduction(self) -> int:
        return self.stack_frames * 2**self.ctc_layer


def reduce_mask(mask: torch.Tensor, factor: int) -> torch.Tensor:
    """(B, T) -> (B, T / factor): 1 where a group of `factor` frames holds a real frame."""
    return mask.reshape(mask.shape[0], -1, factor).amax(-1)


class BiLSTM(nn.Module):
    """A bidirectional LSTM layer whose backward direction reads each row reversed within its length."""

    def __init__(self, input_size: int, hidden: int):
        super().__init__()
        self.forward_rnn = nn.LSTM(input_size, hidden, batch_first=True)
        self.backward_rnn = nn.LSTM(input_size, hidden, batch_first=True)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """x (B, T, D) zero on padding, lengths (B,) -> (B, T, 2H), not yet zeroed on padding."""
        # Explicit zero states sized from x: otherwise the ONNX exporter bakes the example's batch in.
        zeros = x.new_zeros(1, x.shape[0], self.forward_rnn.hidden_size)
        ahead, _ = self.forward_rnn(x, (zeros, zeros))
        behind, _ = self.backward_rnn(reverse_within_length(x, lengths), (zeros, zeros))
        return torch.cat([ahead, reverse_within_length(behind, lengths)], dim=-1)


class Listener(nn.Module):
    """Log-mel frames -> listener states at 1 / time_reduction of the frame rate (and the CTC layer's)."""

    def __init__(self, cfg: ListenAttendSpellConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.listener_hidden
        self.bottom = BiLSTM(cfg.n_mels * cfg.stack_frames, h)
        self.lower = nn.ModuleList(BiLSTM(2 * h, h) for _ in range(cfg.bottom_layers - 1))
        self.pyramid = nn.ModuleList(BiLSTM(4 * h, h) for _ in range(cfg.pyramid_layers))
        self.dropout = nn.Dropout(cfg.dropout)
        # Per-band scale of the clip-normalised features, measured on training data (set_feature_scale).
        self.register_buffer("feature_scale", torch.ones(cfg.n_mels))

    def normalize(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Floored, minus each clip's mean over its real frames, divided by the per-band scale; 0 on padding.

        features (B, T, M) raw log-mel, mask (B, T) -> (B, T, M).
        """
        m = mask[:, :, None].to(features.dtype)  # (B, T, 1)
        x = features.clamp(min=self.cfg.feature_floor)
        mean = (x * m).sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1.0)  # (B, 1, M)
        return (x - mean) / self.feature_scale * m

    def forward(
        self, features: torch.Tensor, mask: torch.Tensor, augment: Callable | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Listens to a padded batch.

        Args:
            features: (B, T, M) raw log-mel frames, T a multiple of time_reduction, zero on padding.
            mask: (B, T) int, 1 for real frames.
            augment: training only: (x (B, T, M), lengths (B,)) -> x, applied to the normalised features.

        Returns:
            states (B, S, 2H) and their mask (B, S), S = T / time_reduction; the CTC layer's states
            (B, T / ctc_reduction, 2H) and mask. States are 0 on padding.
        """
        x = self.normalize(features, mask)
        if augment is not None:
            x = augment(x, mask.sum(1))
        if self.cfg.stack_frames > 1:
            s = self.cfg.stack_frames
            x = x.reshape(x.shape[0], -1, s * self.cfg.n_mels)  # (B, T / s, s M): s frames side by side
            mask = reduce_mask(mask, s)
        x = self._masked(self.bottom(x, mask.sum(1)), mask)  # (B, T / s, 2H)
        for layer in self.lower:
            x = self._masked(layer(self.dropout(x), mask.sum(1)), mask)
        ctc = (x, mask)
        width = 4 * self.cfg.listener_hidden  # a pair of BiLSTM outputs (a constant keeps the graph's width static)
        for i, layer in enumerate(self.pyramid):
            x = self.dropout(x).reshape(x.shape[0], -1, width)  # (B, T / 2, 4H): neighbouring pairs side by side
            mask = reduce_mask(mask, 2)
            x = self._masked(layer(x, mask.sum(1)), mask)
            if i + 1 == self.cfg.ctc_layer:
                ctc = (x, mask)
        return x, mask, *ctc

    @staticmethod
    def _masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return x * mask[:, :, None].to(x.dtype)


class Speller(nn.Module):
    """An LSTM cell with additive attention over the listener states; `step()` is the exported decoder."""

    def __init__(self, cfg: ListenAttendSpellConfig):
        super().__init__()
        memory = 2 * cfg.listener_hidden
        self.embed = nn.Embedding(cfg.vocab_size, cfg.embed_dim)
        self.cell = nn.LSTMCell(cfg.embed_dim + memory, cfg.speller_hidden)
        self.attention = AdditiveAttention(cfg.speller_hidden, memory, cfg.attention_dim)
        self.location_conv = nn.Conv1d(1, cfg.location_filters, cfg.location_kernel,
                                       padding=cfg.location_kernel // 2, bias=False)
        self.location_proj = nn.Linear(cfg.location_filters, cfg.attention_dim, bias=False)
        self.init_proj = nn.Linear(memory, 2 * cfg.speller_hidden)
        self.hidden = nn.Linear(cfg.speller_hidden + memory, cfg.speller_hidden)
        self.out = nn.Linear(cfg.speller_hidden, cfg.vocab_size)
        self.dropout = nn.Dropout(cfg.dropout)

    def initial_state(self, memory: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h0, c0 (B, Hs) from the masked mean of the listener states (B, S, 2H)."""
        m = mask[:, :, None].to(memory.dtype)
        mean = (memory * m).sum(1) / m.sum(1).clamp(min=1.0)  # (B, 2H)
        h, c = torch.tanh(self.init_proj(mean)).split(self.cell.hidden_size, dim=-1)
        return h, c

    def step(self, embedded, h, c, context, previous, memory, keys, mask):
        """One character for every row.

        Args:
            embedded: (B, E) the previous character's embedding.
            h, c: (B, Hs) LSTM state; context: (B, 2H) the previous step's attention context (zeros first).
            previous: (B, S) the previous step's attention weights (zeros first; 0 on padding).
            memory: (B, S, 2H) listener states; keys: (B, S, A) their score-space projection.
            mask: (B, S) 1 for real positions.

        Returns:
            logits (B, V), new h, c, context, and the attention weights (B, S) (0 on padding).
        """
        h, c = self.cell(torch.cat([embedded, context], dim=-1), (h, c))
        # Padding's previous weights are 0 and the convolution pads with 0: a row sees the same alone or batched.
        location = self.location_proj(self.location_conv(previous[:, None, :]).transpose(1, 2))  # (B, S, A)
        scores = self.attention.scores(h, keys, location)  # (B, S)
        scores = scores.masked_fill(mask == 0, torch.finfo(scores.dtype).min)
        weights = scores.softmax(dim=-1)
        context = (weights[:, None, :] @ memory)[:, 0]  # (B, 2H)
        hidden = torch.tanh(self.hidden(torch.cat([h, context], dim=-1)))
        return self.out(self.dropout(hidden)), h, c, context, weights


class ListenAttendSpell(nn.Module):
    # The family name its checkpoints record (common/training.py).
    ARCH = "listen-attend-spell"

    def __init__(self, cfg: ListenAttendSpellConfig):
        super().__init__()
        self.cfg = cfg
        self.listener = Listener(cfg)
        self.speller = Speller(cfg)
        self.ctc_head = nn.Linear(2 * cfg.listener_hidden, cfg.vocab_size)  # training only; not exported

    def set_feature_scale(self, scale: torch.Tensor) -> None:
        """Per-band standard deviation of clip-normalised training features (n_mels,)."""
        self.listener.feature_scale.copy_(scale.clamp(min=1e-3))

    def encode(self, features: torch.Tensor, mask: torch.Tensor):
        """(B, T, M) frames, (B, T) mask -> memory (B, S, 2H), keys (B, S, A), mask (B, S), h0, c0 (B, Hs)."""
        return self._listen(features, mask)[0]

    def _listen(self, features: torch.Tensor, mask: torch.Tensor):
        """encode()'s outputs, and the CTC layer's states and mask."""
        memory, reduced, ctc_states, ctc_mask = self.listener(features, mask)
        keys = self.speller.attention.keys(memory)
        h, c = self.speller.initial_state(memory, reduced)
        return (memory, keys, reduced, h, c), (ctc_states, ctc_mask)

    def encode_for_serving(self, features: torch.Tensor, mask: torch.Tensor):
        """encode()'s outputs, then what the server reads from the CTC head: (B,) the characters of each row's
        best path (argmax per frame, repeats merged, blanks dropped), an estimate of the transcript's length
        that can stop a speller caught in a loop (manifest encoder.length_hint), and the (B, T', V)
        log-probabilities with (B,) real CTC frames, with which it scores every candidate character (manifest
        encoder.ctc, joint CTC/attention decoding)."""
        (memory, keys, reduced, h, c), (ctc_states, ctc_mask) = self._listen(features, mask)
        log_probs = self.ctc_head(ctc_states).log_softmax(-1)  # (B, T', V)
        best = log_probs.argmax(-1)  # (B, T')
        previous = torch.cat([torch.full_like(best[:, :1], -1), best[:, :-1]], dim=1)
        emitted = (best != previous) & (best != vocabulary.BLANK_ID) & ctc_mask.bool()
        return memory, keys, reduced, h, c, emitted.sum(1), log_probs, ctc_mask.sum(1)

    def initial_context(self, batch: int) -> torch.Tensor:
        return torch.zeros(batch, 2 * self.cfg.listener_hidden)

    def decode_step(self, input_ids, h, c, context, previous, memory, keys, mask):
        """input_ids (B,) -> logits (B, V), new h, c, context and the step's attention (B, S), the next
        step's `previous`."""
        return self.speller.step(self.speller.embed(input_ids), h, c, context, previous, memory, keys, mask)

    def forward(self, features, mask, tgt_in, augment: Callable | None = None, bf16_listener: bool = False):
        """Teacher-forced training pass.

        Args:
            features: (B, T, M) frames, T a multiple of time_reduction; mask: (B, T).
            tgt_in: (B, U) the start token and the transcript's characters (padded with <pad>).
            augment: see Listener.forward.
            bf16_listener: run the listener in bf16 autocast (its BiLSTMs on a CPU's AMX / AVX512-BF16 units);
                the speller stays float32, where casting at each of its steps costs more than it saves.

        Returns:
            attention logits (B, U, V); CTC log-probabilities (B, T / ctc_reduction, V) and their lengths (B,).
        """
        memory, reduced, ctc, ctc_lengths = self.listen(features, mask, augment, bf16_listener)
        return self.spell(memory, reduced, tgt_in), ctc, ctc_lengths

    def listen(self, features, mask, augment: Callable | None = None, bf16_listener: bool = False):
        """forward()'s listener half: memory (B, S, 2H) and its mask (B, S) for `spell`, and the CTC
        log-probabilities (B, T / ctc_reduction, V) with their lengths (B,)."""
        with torch.autocast(features.device.type, dtype=torch.bfloat16, enabled=bf16_listener):
            memory, reduced, ctc_states, ctc_mask = self.listener(features, mask, augment)
        memory, ctc_states = memory.float(), ctc_states.float()
        ctc = self.ctc_head(self.listener.dropout(ctc_states)).log_softmax(-1)
        return memory, reduced, ctc, ctc_mask.sum(1)

    def start_spelling(self, memory: torch.Tensor, reduced: torch.Tensor):
        """What the speller's first step takes beside the listener states: their keys (B, S, A), h, c (B, Hs),
        a zero context (B, 2H) and zero previous attention (B, S)."""
        keys = self.speller.attention.keys(memory)
        h, c = self.speller.initial_state(memory, reduced)
        context = self.initial_context(memory.shape[0]).to(memory.dtype)
        return keys, h, c, context, torch.zeros(reduced.shape, dtype=memory.dtype)

    def spell(self, memory: torch.Tensor, reduced: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """The speller teacher-forced through tgt_in (B, U) over the listener states memory (B, S, 2H) with
        their mask reduced (B, S): logits (B, U, V)."""
        keys, h, c, context, weights = self.start_spelling(memory, reduced)
        embedded = self.speller.embed(tgt_in)  # (B, U, E)
        logits = []
        for u in range(tgt_in.shape[1]):
            step_logits, h, c, context, weights = self.speller.step(
                embedded[:, u], h, c, context, weights, memory, keys, reduced)
            logits.append(step_logits)
        return torch.stack(logits, dim=1)

    @torch.no_grad()
    def greedy_decode(self, features, mask, max_new_tokens: int, suppress_ids: Sequence[int] = (),
                      ctc_weight: float = 0.0):
        """Reference greedy search (PyTorch, batch-synchronous) for parity tests and evaluation.

        With a `ctc_weight`, every candidate is ranked by (1 - w) log p_speller + w x its CTC prefix score, by
        the scorer the server uses (server/decoding/ctc_prefix.py): joint CTC/attention decoding as served.

        Returns per row the generated ids (EOS excluded) and a (steps, S) attention tensor.
        """
        from attnserve.server.decoding.ctc_prefix import CTCPrefixScorer

        memory, keys, reduced, h, c, _, ctc_log_probs, ctc_lengths = self.encode_for_serving(features, mask)
        state = [h, c, self.initial_context(features.shape[0]), torch.zeros(reduced.shape)]
        scorer = None
        if ctc_weight:
            scorer = CTCPrefixScorer(ctc_log_probs.numpy(), ctc_lengths.numpy(), vocabulary.BLANK_ID,
                                     vocabulary.EOS_ID)
        steps = [0]

        def step(ids):
            if scorer is not None and steps[0]:  # the previous step's choice extends each prefix
                scorer.advance(ids.numpy())
            steps[0] += 1
            logits, state[0], state[1], state[2], state[3] = self.decode_step(ids, *state, memory, keys, reduced)
            if scorer is not None:
                logits = (1 - ctc_weight) * logits.log_softmax(-1) + ctc_weight * torch.from_numpy(scorer.score())
            return logits, state[3]

        start = torch.full((features.shape[0],), vocabulary.START_ID)
        outputs, attentions = greedy_search(step, start, vocabulary.EOS_ID, max_new_tokens, suppress_ids)
        return outputs, [torch.stack(a) if a else torch.zeros(0, memory.shape[1]) for a in attentions]


def teacher_forcing_targets(sequences: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, U) tgt_in (the start token, then each sequence) and tgt_out (each sequence, then EOS), <pad>-padded."""
    u = max(len(s) for s in sequences) + 1
    tgt = torch.full((len(sequences), u + 1), vocabulary.PAD_ID)
    for row, sequence in enumerate(sequences):
        tgt[row, : len(sequence) + 2] = torch.tensor([vocabulary.START_ID, *sequence, vocabulary.EOS_ID])
    return tgt[:, :-1], tgt[:, 1:]


def pad_features(clips: Sequence[torch.Tensor], multiple: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(T_i, M) clips -> (B, T, M) zero-padded to a multiple of `multiple`, and the (B, T) int64 mask."""
    longest = max(len(x) for x in clips)
    t = -(-longest // multiple) * multiple
    features = torch.zeros(len(clips), t, clips[0].shape[1])
    mask = torch.zeros(len(clips), t, dtype=torch.int64)
    for row, x in enumerate(clips):
        features[row, : len(x)] = x
        mask[row, : len(x)] = 1
    return features, mask
