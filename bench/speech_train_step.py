"""One training step of the speech recognizer's shape (speech-en 3), float32 against a bf16 listener.

    .venv/bin/python bench/speech_train_step.py --steps 7

A batch of 20 clips of 8 s (random log-mel frames, 110 characters each: `--batch-seconds 160`'s size) goes
through the joint CTC/attention loss, backward included, alternately with `TrainOptions.bf16_listener` off
and on (`train --bf16-listener`). One thread. Prints the median step time of each, the first two steps
left out. Random weights and inputs: only the time is measured.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from attnserve.export.speech import vocabulary
from attnserve.export.speech.model import ListenAttendSpell, ListenAttendSpellConfig
from attnserve.export.speech.train import Batch, TrainOptions, joint_loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=7, help="steps of each kind")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = ListenAttendSpell(ListenAttendSpellConfig(stack_frames=4, bottom_layers=3, pyramid_layers=1,
                                                      ctc_layer=0)).train()
    clips, frames, characters = 20, 800, 110
    features = torch.randn(clips, frames, model.cfg.n_mels)
    mask = torch.ones(clips, frames, dtype=torch.long)
    target = torch.randint(len(vocabulary.SPECIAL_TOKENS), model.cfg.vocab_size, (clips, characters + 1))
    target[:, 0] = vocabulary.START_ID
    batch = Batch(features, mask, target[:, :-1], target[:, 1:], clips * frames / 100)
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(2 * args.steps):
        bf16 = i % 2 == 1
        started = time.perf_counter()
        loss = joint_loss(model, batch, TrainOptions(bf16_listener=bf16))
        model.zero_grad(set_to_none=True)
        loss.backward()
        if i >= 2:
            times[bf16].append(time.perf_counter() - started)
    fp32, bf16 = (statistics.median(times[k]) for k in (False, True))
    print(f"float32 {fp32:.2f} s/step, bf16 listener {bf16:.2f} s/step: {fp32 / bf16:.2f}x")


if __name__ == "__main__":
    main()
