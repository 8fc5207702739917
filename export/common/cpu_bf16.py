"""Whether this CPU runs bf16 in hardware, for the trainers' bf16 autocast options.

Where it has AVX512-BF16 or AMX units, bf16 autocast makes a training step 1.1-1.3x faster (bench/README.md).
Where it has neither, oneDNN emulates bf16 matrix products (the translator's step took 62 s instead of 5 s
on an AVX2-only AMD EPYC) and has no bf16 LSTM at all (the speech listener fails with "could not create a
primitive descriptor"), so the options are refused there with a message saying why.
"""

from __future__ import annotations

import torch


def has_native_bf16() -> bool:
    """True where oneDNN runs bf16 kernels in hardware."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def refusal(flag: str, device: str) -> str | None:
    """Why `flag` (a bf16 autocast option) cannot be used on this CPU, or None when it can or when the training
    runs on another device (`device`, e.g. "cuda": bf16 there is the GPU's business)."""
    if torch.device(device).type != "cpu" or has_native_bf16():
        return None
    return (f"{flag} needs a CPU with bf16 units (AVX512-BF16 or AMX), and this one has none: bf16 would be "
            "emulated, far slower than float32 (or not run at all: oneDNN has no bf16 LSTM here); leave it out")
