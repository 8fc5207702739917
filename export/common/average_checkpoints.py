"""Averages the weights of several checkpoints of one run into one checkpoint (Vaswani et al. 2017 averaged
their last checkpoints; late checkpoints of one run sit around the same minimum, and their mean often sits
nearer its centre than any of them).

Works for every family here (translator, speech, image): a checkpoint is a dict whose "model" is a state
dict, beside its "arch", "config", "tokenizer" and training "state". The output keeps the last checkpoint's
fields, drops the optimizer (an average has no optimizer state of its own) and records what it averaged, so
it exports and evaluates like any checkpoint; to train on from it, use the trainers' --init-weights.

    python -m attnserve.export.common.average_checkpoints RUN/ckpt-2010.pt RUN/ckpt-2022.pt RUN/last.pt --out RUN/avg3.pt
"""

from __future__ import annotations

import argparse
import pathlib
from collections.abc import Mapping, Sequence

import torch


def average_state_dicts(state_dicts: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The mean of floating-point tensors, computed in float32 and stored in each tensor's own dtype; other
    tensors (counters, integer buffers) are taken from the last state dict.

    Raises:
        ValueError: no state dicts, or they differ in names or shapes.
    """
    if not state_dicts:
        raise ValueError("nothing to average")
    last = state_dicts[-1]
    for i, weights in enumerate(state_dicts[:-1]):
        if weights.keys() != last.keys():
            raise ValueError(f"state dict {i} has other tensors than the last: {sorted(weights.keys() ^ last.keys())[:5]}")
        for name, tensor in weights.items():
            if tensor.shape != last[name].shape:
                raise ValueError(f"state dict {i}: {name} is {tuple(tensor.shape)}, the last's {tuple(last[name].shape)}")
    averaged = {}
    for name, tensor in last.items():
        if tensor.is_floating_point():
            mean = sum(weights[name].float() for weights in state_dicts) / len(state_dicts)
            averaged[name] = mean.to(tensor.dtype)
        else:
            averaged[name] = tensor.clone()
    return averaged


def average_checkpoints(paths: Sequence[pathlib.Path], out: pathlib.Path) -> dict:
    """Writes the averaged checkpoint of `paths` to `out` and returns it.

    Raises:
        ValueError: the checkpoints are of different families or configs.
    """
    checkpoints = [torch.load(path, map_location="cpu", weights_only=False) for path in paths]
    last = checkpoints[-1]
    for path, ckpt in zip(paths, checkpoints):
        for field in ("arch", "config"):
            if ckpt.get(field) != last.get(field):
                raise ValueError(f"{path}: its {field} differs from {paths[-1]}'s; only one run's checkpoints average")
    averaged = {key: value for key, value in last.items() if key not in ("model", "optimizer", "rng")}
    averaged["model"] = average_state_dicts([ckpt["model"] for ckpt in checkpoints])
    # The count as the translator's trainer records it (its model card prints it), and the steps.
    averaged["state"] = {
        **last.get("state", {}),
        "averaged_checkpoints": len(paths),
        "averaged_steps": [c.get("state", {}).get("step") for c in checkpoints],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(averaged, out)
    return averaged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", type=pathlib.Path, nargs="+", help="checkpoints of one run, oldest first")
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args()
    if len(args.checkpoints) < 2:
        parser.error("give at least two checkpoints")
    averaged = average_checkpoints(args.checkpoints, args.out)
    steps = averaged["state"]["averaged_steps"]
    print(f"{args.out}: the mean of {len(steps)} checkpoints (steps {steps})")


if __name__ == "__main__":
    main()
