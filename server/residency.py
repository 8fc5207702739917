"""What a batch tells its runtime about the decoder inputs it keeps between steps (no numpy, no onnxruntime).

Made by `Slots.residency` (server/slots.py), read by `DeviceState` (server/device_state.py), which keeps
device copies of those inputs under IO binding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class Residency:
    """What a batch tells the runtime about the decoder inputs of one step."""

    # Stable for one set of slot tensors (server/slots.py); device copies are kept per owner.
    owner: object
    # Changes whenever the slots change (rows placed, copied, moved; source axes cut): every device copy of
    # another revision is stale.
    revision: int
    # Changes whenever the appended state changes other than by a step's append (a buffer reallocated).
    cache_revision: int
    # Slots the appended state holds before this step; the step writes slot `cache_length`.
    cache_length: int
    # Inputs unchanged while the revision is (the encoder's K/V and mask).
    static: frozenset[str]
    # Appended-state input -> (the decoder output holding the step's new slot, its time axis).
    appended: Mapping[str, tuple[str, int]]
