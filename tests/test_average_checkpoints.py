"""Checkpoint averaging: the mean of one run's weights, written as a checkpoint that exports like any other."""

from __future__ import annotations

import pytest
import torch

from attnserve.export.common.average_checkpoints import average_checkpoints, average_state_dicts

torch.set_num_threads(1)


def checkpoint(weight: float, step: int, config: dict | None = None) -> dict:
    return {
        "model": {"w": torch.full((2, 3), weight), "h": torch.full((4,), weight, dtype=torch.float16),
                  "count": torch.tensor(step)},
        "optimizer": {"state": {}},
        "rng": torch.get_rng_state(),
        "arch": "transformer",
        "config": config or {"d_model": 8},
        "tokenizer": "{}",
        "state": {"step": step},
    }


def test_mean_of_floats_in_their_dtype_and_last_of_the_rest():
    averaged = average_state_dicts([checkpoint(1.0, 10)["model"], checkpoint(2.0, 20)["model"],
                                    checkpoint(6.0, 30)["model"]])
    torch.testing.assert_close(averaged["w"], torch.full((2, 3), 3.0))
    assert averaged["h"].dtype == torch.float16
    torch.testing.assert_close(averaged["h"], torch.full((4,), 3.0, dtype=torch.float16))
    assert averaged["count"].item() == 30


def test_mismatched_state_dicts_are_refused():
    a, b = checkpoint(1.0, 1)["model"], checkpoint(2.0, 2)["model"]
    with pytest.raises(ValueError, match="other tensors"):
        average_state_dicts([{**a, "extra": torch.zeros(1)}, b])
    with pytest.raises(ValueError, match=r"w is \(3,\)"):
        average_state_dicts([{**a, "w": torch.zeros(3)}, b])
    with pytest.raises(ValueError, match="nothing"):
        average_state_dicts([])


def test_averaged_checkpoint_keeps_the_last_fields_without_optimizer(tmp_path):
    paths = []
    for weight, step in ((1.0, 100), (3.0, 200)):
        paths.append(tmp_path / f"{step}.pt")
        torch.save(checkpoint(weight, step), paths[-1])
    average_checkpoints(paths, tmp_path / "avg.pt")
    saved = torch.load(tmp_path / "avg.pt", weights_only=False)
    assert "optimizer" not in saved and "rng" not in saved
    assert saved["config"] == {"d_model": 8} and saved["tokenizer"] == "{}"
    assert saved["state"]["step"] == 200
    assert saved["state"]["averaged_checkpoints"] == 2 and saved["state"]["averaged_steps"] == [100, 200]
    torch.testing.assert_close(saved["model"]["w"], torch.full((2, 3), 2.0))


def test_checkpoints_of_different_configs_are_refused(tmp_path):
    torch.save(checkpoint(1.0, 1), tmp_path / "a.pt")
    torch.save(checkpoint(1.0, 2, config={"d_model": 16}), tmp_path / "b.pt")
    with pytest.raises(ValueError, match="config differs"):
        average_checkpoints([tmp_path / "a.pt", tmp_path / "b.pt"], tmp_path / "avg.pt")
