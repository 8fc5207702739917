"""Decoder inputs kept on the device between steps (ONNX Runtime IO binding).

Fed host arrays, the CUDA provider copies every decoder input to the GPU at every step: the encoder's
cross-attention K/V and the whole self-attention cache (translate-zh-en at batch 32 and 200 tokens: 39 MB a
step), around a step whose own work on the device is a fraction of that copy. With IO binding the runtime
keeps, per batch, device copies of
- the static inputs (server/slots.py), uploaded once and bound again while the batch's slots are unchanged;
- the appended state (server/kv_cache.py), whose new slot a one-node graph (server/cache_append.onnx, export/server_graphs.py) writes
  into the device buffer after each step, on the device, so that it stays what the host buffer becomes.
The host tensors remain the truth. Whatever else changes a batch's slots (rows leaving or joining, a beam
copied, a buffer grown) gives them a new revision, and the next step uploads them again. The small inputs of
a step (tokens, positions, masks) and replaced state (an LSTM's h, c) are uploaded every step; logits,
attention and the new slots come back to the host, as without IO binding.

Off on the CPU (`RuntimeOptions.io_binding`): there the "device" is host memory, and writing each new slot
through a graph copies the buffer once more. Tests turn it on there to check it against the plain path.
"""

from __future__ import annotations

import collections
import dataclasses
import pathlib
from collections.abc import Mapping

import numpy as np
import onnxruntime as ort

from attnserve.server.residency import Residency

CACHE_APPEND_GRAPH = pathlib.Path(__file__).with_name("cache_append.onnx")


@dataclasses.dataclass(eq=False)
class _Copies:
    revision: int
    cache_revision: int
    cache_length: int  # slots the appended-state copies hold
    values: dict[str, ort.OrtValue]


class DeviceState:
    """Runs a decoder session with IO binding, keeping the inputs a `Residency` names on the device.

    Args:
        decoder: the decoder session.
        outputs: its output names, in the order `run` returns them.
        device: "cpu" or "cuda"; device_id: its ordinal.
    """

    # Batches whose copies are kept (least recently stepped first out): a model steps one running batch, and
    # short-lived ones (beam groups split off, batches being merged) should not hold device memory long.
    KEPT_BATCHES = 4

    def __init__(self, decoder: ort.InferenceSession, outputs: list[str], device: str, device_id: int = 0):
        self._decoder = decoder
        self._outputs = outputs
        self._device, self._device_id = device, device_id
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._append = ort.InferenceSession(str(CACHE_APPEND_GRAPH), options, providers=decoder.get_providers())
        self._kept: collections.OrderedDict[object, _Copies] = collections.OrderedDict()
        # Input name -> how many times it was copied to the device whole (tests and benchmarks read it).
        self.uploads: collections.Counter[str] = collections.Counter()

    def run(self, feeds: Mapping[str, np.ndarray], residency: Residency) -> dict[str, np.ndarray]:
        """One decoder step; returns every output by name, on the host."""
        copies = self._copies(residency)
        binding = self._decoder.io_binding()
        for name, x in feeds.items():
            if name in residency.static or name in residency.appended:
                if name not in copies.values:
                    copies.values[name] = self._upload(name, x)
                binding.bind_ortvalue_input(name, copies.values[name])
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(x))
        for name in self._outputs:
            binding.bind_output(name, "cpu")
        self._decoder.run_with_iobinding(binding)
        outputs = dict(zip(self._outputs, binding.copy_outputs_to_cpu()))
        for name, (output, time_axis) in residency.appended.items():
            copies.values[name] = self._write_slot(copies.values[name], outputs[output], time_axis,
                                                   residency.cache_length)
        copies.cache_length = residency.cache_length + 1
        return outputs

    def forget(self) -> None:
        """Drops every device copy (a failed step may have left them half updated)."""
        self._kept.clear()

    def _copies(self, residency: Residency) -> _Copies:
        """The owner's device copies still valid for this step (the others dropped), most recent last."""
        copies = self._kept.pop(residency.owner, None)
        if copies is None or copies.revision != residency.revision:
            copies = _Copies(residency.revision, residency.cache_revision, residency.cache_length, {})
        elif (copies.cache_revision, copies.cache_length) != (residency.cache_revision, residency.cache_length):
            for name in residency.appended:  # reallocated, or appended on the host alone: stale
                copies.values.pop(name, None)
            copies.cache_revision, copies.cache_length = residency.cache_revision, residency.cache_length
        self._kept[residency.owner] = copies
        while len(self._kept) > self.KEPT_BATCHES:
            self._kept.popitem(last=False)
        return copies

    def _upload(self, name: str, x: np.ndarray) -> ort.OrtValue:
        self.uploads[name] += 1
        # A copy even on the CPU, where ORT would wrap the array itself: the host array changes later, and a
        # copy that followed it would hide a change the device copy missed.
        return ort.OrtValue.ortvalue_from_numpy(np.array(x, order="C", copy=True), self._device, self._device_id)

    def _write_slot(self, past: ort.OrtValue, new: np.ndarray, time_axis: int, position: int) -> ort.OrtValue:
        """The device buffer with slot `position` along `time_axis` set to the step's new slot."""
        shape = past.shape()
        slot_shape = [1] * len(shape)
        slot_shape[time_axis] = shape[time_axis]
        slot = np.zeros(slot_shape, dtype=bool)
        slot.reshape(-1)[position] = True
        binding = self._append.io_binding()
        binding.bind_cpu_input("slot", slot)
        binding.bind_cpu_input("new", np.ascontiguousarray(np.take(new, [0], axis=time_axis)))
        binding.bind_ortvalue_input("past", past)
        binding.bind_output("updated", self._device, self._device_id)
        self._append.run_with_iobinding(binding)
        return binding.get_outputs()[0]
