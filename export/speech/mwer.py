"""Minimum word error rate fine-tuning of the listen-attend-spell recognizer (export/speech/train.py --mwer-weight).

Cross-entropy teaches the speller the next character after the right ones; the served search ranks whole
candidates and is scored by their word errors. The expected word errors over a few of the model's own
candidates (Prabhavalkar et al. 2018, "Minimum word error rate training for attention-based
sequence-to-sequence models") move probability from the candidates with more errors than their average to
those with fewer. The candidates here are the greedy output and random draws from the speller (Shannon 2017),
decoded together as one batch: no beam search inside a training step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.nn import functional as F

from attnserve.export.speech import vocabulary
from attnserve.export.speech.model import ListenAttendSpell, teacher_forcing_targets
from attnserve.export.speech.scoring import edit_distance


@torch.no_grad()
def draw_candidates(model: ListenAttendSpell, memory: torch.Tensor, reduced: torch.Tensor, draws: int,
                    max_lengths: Sequence[int], suppress_ids: Sequence[int]) -> list[list[list[int]]]:
    """Per row, its greedy output and `draws` random ones (character ids, EOS excluded), the speller without
    dropout; a candidate stops at EOS or at its row's max length."""
    rows = memory.shape[0]
    per_row = draws + 1
    memory, reduced = memory.repeat_interleave(per_row, 0), reduced.repeat_interleave(per_row, 0)
    limits = torch.tensor(max_lengths).repeat_interleave(per_row)
    greedy = torch.arange(len(limits)) % per_row == 0
    was_training = model.training
    model.eval()
    try:
        keys, h, c, context, weights = model.start_spelling(memory, reduced)
        ids = torch.full((len(limits),), vocabulary.START_ID)
        done = torch.zeros(len(limits), dtype=torch.bool)
        out = [[] for _ in range(len(limits))]
        for step in range(int(limits.max())):
            logits, h, c, context, weights = model.decode_step(ids, h, c, context, weights, memory, keys, reduced)
            logits[:, list(suppress_ids)] = float("-inf")
            drawn = torch.multinomial(logits.softmax(-1), 1)[:, 0]
            ids = torch.where(greedy, logits.argmax(-1), drawn)
            done |= ids == vocabulary.EOS_ID
            for row in (~done).nonzero()[:, 0].tolist():
                out[row].append(int(ids[row]))
            done |= step + 1 >= limits
            if bool(done.all()):
                break
    finally:
        model.train(was_training)
    return [out[r * per_row:(r + 1) * per_row] for r in range(rows)]


def sequence_log_probs(model: ListenAttendSpell, memory: torch.Tensor, reduced: torch.Tensor,
                       candidates: list[list[list[int]]]) -> torch.Tensor:
    """(B, N) summed log-probability of each row's N candidates and their EOS, teacher-forced (with grad)."""
    per_row = len(candidates[0])
    tgt_in, tgt_out = teacher_forcing_targets([c for row in candidates for c in row])
    logits = model.spell(memory.repeat_interleave(per_row, 0), reduced.repeat_interleave(per_row, 0), tgt_in)
    token = -F.cross_entropy(logits.transpose(1, 2), tgt_out, ignore_index=vocabulary.PAD_ID, reduction="none")
    return token.sum(1).view(len(candidates), per_row)


def expected_relative_errors(log_probs: torch.Tensor, errors: torch.Tensor) -> torch.Tensor:
    """Sum over rows of sum_n p(n) (errors_n - the row's mean errors), p the softmax of the (B, N) candidates'
    log-probabilities: subtracting the mean leaves the gradient's direction and lowers its variance."""
    p = log_probs.softmax(-1)
    return (p * (errors - errors.mean(-1, keepdim=True))).sum()


def mwer_loss(model: ListenAttendSpell, memory: torch.Tensor, reduced: torch.Tensor, references: Sequence[str],
              decode: Callable[[list[int]], str], draws: int, suppress_ids: Sequence[int]) -> torch.Tensor:
    """The batch's summed expected relative word errors over each row's greedy and `draws` drawn candidates."""
    limits = [2 * len(r) + 10 for r in references]
    candidates = draw_candidates(model, memory, reduced, draws, limits, suppress_ids)
    errors = torch.tensor([[edit_distance(decode(c).split(), ref.split()) for c in row]
                           for row, ref in zip(candidates, references)], dtype=torch.float32)
    return expected_relative_errors(sequence_log_probs(model, memory, reduced, candidates), errors)
