"""Minimum word error rate fine-tuning (export/speech/mwer.py) on a tiny random recognizer: the greedy
candidate == the reference greedy search, a candidate's log-probability == the teacher-forced pass summed,
the loss ignores an offset of the errors and moves probability to the candidates with fewer, and a training
step with it reaches the listener and lowers the expected errors."""

from __future__ import annotations

import pytest
import torch

from attnserve.export.speech import vocabulary
from attnserve.export.speech.model import ListenAttendSpell, pad_features
from attnserve.export.speech.mwer import draw_candidates, expected_relative_errors, mwer_loss, sequence_log_probs
from attnserve.export.speech.train import Batch, TrainOptions, joint_loss
from test_speech_model import frames, tiny_config

pytestmark = pytest.mark.usefixtures("torch_one_thread")
SUPPRESS = vocabulary.suppressed_ids()


def listened(model: ListenAttendSpell, lengths=(90, 60)):
    features, mask = pad_features([frames(t) for t in lengths], 8)
    memory, reduced, _, _ = model.listen(features, mask)
    return features, mask, memory, reduced


def test_the_first_candidate_of_each_row_is_the_greedy_search():
    torch.manual_seed(0)
    model = ListenAttendSpell(tiny_config()).eval()
    features, mask, memory, reduced = listened(model)
    candidates = draw_candidates(model, memory, reduced, 3, [12, 12], SUPPRESS)
    greedy, _ = model.greedy_decode(features, mask, 12, SUPPRESS)
    assert [row[0] for row in candidates] == [list(g) for g in greedy]
    assert all(len(row) == 4 and all(len(c) <= 12 for c in row) for row in candidates)
    assert all(t not in SUPPRESS and t != vocabulary.EOS_ID for row in candidates for c in row for t in c)


def test_drawn_candidates_differ_and_stop_at_their_row_limit():
    torch.manual_seed(0)
    model = ListenAttendSpell(tiny_config()).eval()  # random weights: a flat distribution, long draws
    _, _, memory, reduced = listened(model)
    candidates = draw_candidates(model, memory, reduced, 6, [5, 9], SUPPRESS)
    assert len({tuple(c) for c in candidates[1][1:]}) > 1
    assert max(len(c) for c in candidates[0]) <= 5 and max(len(c) for c in candidates[1]) == 9


def test_a_candidates_log_probability_is_its_teacher_forced_pass_summed_with_its_end():
    torch.manual_seed(0)
    model = ListenAttendSpell(tiny_config()).eval()
    features, mask, memory, reduced = listened(model, (96, 64))  # multiples of 8: a row alone needs no padding
    candidates = [[[11, 8, 4], [13]], [[5, 9, 9, 7], []]]
    got = sequence_log_probs(model, memory, reduced, candidates)
    for row in range(2):
        for n, c in enumerate(candidates[row]):
            tgt = torch.tensor([[vocabulary.START_ID, *c, vocabulary.EOS_ID]])
            real = int(mask[row].sum())
            logits, _, _ = model(features[row:row + 1, :real], mask[row:row + 1, :real], tgt[:, :-1])
            expected = logits.log_softmax(-1)[0].gather(1, tgt[0, 1:, None]).sum()
            assert got[row, n].item() == pytest.approx(expected.item(), abs=1e-4)


def test_the_loss_ignores_an_offset_of_the_errors_and_moves_probability_to_fewer_errors():
    log_probs = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    errors = torch.tensor([[3.0, 1.0, 2.0]])
    loss = expected_relative_errors(log_probs, errors)
    assert loss.item() == pytest.approx(expected_relative_errors(log_probs, errors + 7).item())
    loss.backward()
    # Gradient descent lowers the candidate with the most errors and raises the one with the fewest.
    assert log_probs.grad[0, 0] > 0 > log_probs.grad[0, 1]
    assert expected_relative_errors(log_probs, torch.tensor([[2.0, 2.0, 2.0]])).item() == 0


def test_the_mwer_term_reaches_the_listener_and_joins_the_training_loss():
    torch.manual_seed(3)
    model = ListenAttendSpell(tiny_config()).train()
    tokenizer = vocabulary.character_tokenizer()
    features, mask, memory, reduced = listened(model)
    # The greedy outputs as the references (no dropout in tiny models): the drawn candidates have more errors.
    references = [tokenizer.decode(list(g)) for g in model.greedy_decode(features, mask, 12, SUPPRESS)[0]]
    mwer_loss(model, memory, reduced, references, tokenizer.decode, 3, SUPPRESS).backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.listener.parameters())

    tgt = torch.tensor([[vocabulary.START_ID, 11, 8, 4, 9, vocabulary.EOS_ID],
                        [vocabulary.START_ID, 13, 5, 9, vocabulary.EOS_ID, 0]])
    batch = Batch(features, mask, tgt[:, :-1], tgt[:, 1:], 1.5)
    model.eval()  # no dropout: the two passes differ by the MWER term alone
    plain = joint_loss(model, batch, TrainOptions(label_smoothing=0.0))
    with_mwer = joint_loss(model, batch, TrainOptions(label_smoothing=0.0, mwer_weight=1.0, mwer_draws=3),
                           None, references, tokenizer)
    assert with_mwer.item() != plain.item()
    with pytest.raises(ValueError, match="reference transcripts"):
        joint_loss(model, batch, TrainOptions(mwer_weight=1.0))


def test_sgd_on_the_expected_relative_errors_lowers_them():
    torch.manual_seed(3)
    model = ListenAttendSpell(tiny_config()).eval()
    # Fixed candidates, so that only the model changes.
    _, _, memory, reduced = listened(model)
    candidates = draw_candidates(model, memory, reduced, 3, [8, 8], SUPPRESS)
    errors = torch.tensor([[float(n) for n in range(4)]] * 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    before = expected_relative_errors(sequence_log_probs(model, memory.detach(), reduced, candidates), errors)
    for _ in range(3):
        optimizer.zero_grad()
        _, _, memory, reduced = listened(model)
        expected_relative_errors(sequence_log_probs(model, memory, reduced, candidates), errors).backward()
        optimizer.step()
    _, _, memory, reduced = listened(model)
    after = expected_relative_errors(sequence_log_probs(model, memory, reduced, candidates), errors)
    assert after.item() < before.item()


def test_mwer_loss_scores_candidates_against_the_references_in_words():
    torch.manual_seed(0)
    model = ListenAttendSpell(tiny_config()).eval()
    _, _, memory, reduced = listened(model)
    tokenizer = vocabulary.character_tokenizer()
    loss = mwer_loss(model, memory, reduced, ["a b", "c"], tokenizer.decode, 2, SUPPRESS)
    assert loss.shape == () and torch.isfinite(loss)
