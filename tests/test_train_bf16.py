"""Training with bf16 autocast on a CPU (`--cpu-bf16`): the matrix products run in bf16, the weights, the
loss and its gradients stay float32, and the loss is the float32 one within bf16's precision."""

import copy
import sys

import pytest
import torch

from attnserve.export.common import cpu_bf16
from attnserve.export.speech import train as speech_train
from attnserve.export.translation import train
from tests.conftest import TINY_CORPUS


def test_cpu_bf16_runs_the_products_in_bf16_and_keeps_the_loss_and_weights_in_float32(tiny_torch_model, tiny_tokenizer):
    torch.set_num_threads(1)
    pairs = list(zip(TINY_CORPUS[1::2], TINY_CORPUS[0::2]))  # (en, zh)
    examples = train.make_examples(pairs, tiny_tokenizer, 64)
    batch = train.collate(examples, list(range(len(examples))))
    model = copy.deepcopy(tiny_torch_model).eval()  # no dropout: both runs see the same network
    seen = []
    model.register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))

    full, n = train.loss_on(model, batch, 0.0)
    half, same_n = train.loss_on(model, batch, 0.0, cpu_bf16=True)
    assert seen == [torch.float32, torch.bfloat16]
    assert n == same_n and half.dtype == torch.float32
    assert abs(half.item() - full.item()) / full.item() < 0.02
    (half / n).backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 and p.dtype == torch.float32
               for p in model.parameters() if p.requires_grad)


def test_the_phase_record_names_bf16_autocast():
    assert train.device_name("cpu", cpu_bf16=True).endswith(", bf16 autocast)")
    assert "bf16" not in train.device_name("cpu")


@pytest.mark.parametrize("main,flag", [(train.main, "--cpu-bf16"), (speech_train.main, "--bf16-listener")])
def test_a_cpu_without_bf16_units_refuses_the_bf16_options_saying_why(monkeypatch, capsys, tmp_path, main, flag):
    """Emulated bf16 is far slower than float32 (and the listener's LSTM has no bf16 kernel at all there): the
    trainers stop before anything starts, with a message naming the option and the missing units."""
    monkeypatch.setattr(cpu_bf16, "has_native_bf16", lambda: False)
    argv = ["train", "--corpus", str(tmp_path / "corpus"), "--run", str(tmp_path / "run"), flag]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    assert f"{flag} needs a CPU with bf16 units (AVX512-BF16 or AMX)" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_cpu_with_bf16_units_accepts_them(monkeypatch):
    monkeypatch.setattr(cpu_bf16, "has_native_bf16", lambda: True)
    assert cpu_bf16.refusal("--cpu-bf16", "cpu") is None


def test_training_on_a_gpu_is_not_refused_for_the_cpu_it_runs_beside(monkeypatch):
    monkeypatch.setattr(cpu_bf16, "has_native_bf16", lambda: False)
    assert cpu_bf16.refusal("--bf16-listener", "cuda") is None
    assert cpu_bf16.refusal("--bf16-listener", "cpu")
