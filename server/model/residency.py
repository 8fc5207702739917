"""What a batch tells its runtime about the decoder inputs it keeps between steps (no onnxruntime).

Made by `Slots.residency` (server/decoding/slots.py), read by `DeviceState` (server/model/device_state.py), which keeps
device copies of those inputs under IO binding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np


@dataclasses.dataclass(frozen=True)
class Residency:
    """The tensors a batch keeps from one decoder step to the next, and what changed in them since the last.

    Each tensor is given whole: every slot (its rows along axis 0, the batch axis), of which the decoder is fed
    the first ones (the batch's size). A device copy holds every slot too, so that rows joining past the size
    need no new copy.
    """

    # Stable for one set of slot tensors (server/decoding/slots.py); device copies are kept per owner.
    owner: object
    # Changes whenever the slots' tensors are replaced or reshaped (source axes cut): every device copy of
    # another revision is stale.
    revision: int
    # Changes whenever the appended state's buffers are reallocated (they fill every SPARE_SLOTS steps).
    cache_revision: int
    # How the buffers of `cache_revision` were made from the previous revision's: (slots cut from the front,
    # slots used before, the new capacity); None if they were not.
    cache_growth: tuple[int, int, int] | None
    # Slots the appended state holds before this step; the step writes slot `cache_length`.
    cache_length: int
    # How rows changed since the last residency, in order: (sources, targets) where row targets[i] became a
    # copy of row sources[i] (beams kept twice, rows moved into free slots), or (None, targets) where the
    # rows were written from elsewhere (rows joining).
    row_changes: tuple[tuple[tuple[int, ...] | None, tuple[int, ...]], ...]
    # Decoder input -> the whole tensor: inputs unchanged between steps but for `row_changes` (encoder K/V).
    static: Mapping[str, np.ndarray]
    # Appended-state input -> (its whole buffer, the decoder output holding the step's new slot, the time axis).
    appended: Mapping[str, tuple[np.ndarray, str, int]]
