"""Decoder inputs kept on the device between steps (ONNX Runtime IO binding).

Fed host arrays, the CUDA provider copies every decoder input to the GPU at every step: the encoder's
cross-attention K/V and the whole self-attention cache (translate-zh-en at batch 32 and 200 tokens: 39 MB a
step), around a step whose own work on the device is a fraction of that copy. With IO binding the runtime
keeps, per batch, device copies of the encoder K/V (server/decoding/slots.py) and of the K/V cache
(server/decoding/kv_cache.py), every slot of them, and binds the slots in use (a prefix: the batch axis comes first).
Tensors of one shape (every layer's keys and values) are stacked in one device buffer and bound by offset,
so that each kind of update below is one graph run for all of them, not one per tensor:
- rows copied on the host since the last step (beams kept twice, rows moved into free slots) are copied on
  the device too (server/model/copy_rows.onnx), and rows joining are written into the device copies from the
  host (server/model/write_rows.onnx);
- each step's new cache slot is written into the device buffers by another (server/model/cache_append.onnx);
- a cache whose buffers are reallocated (full every 16 steps) is reallocated on the device the same way
  (server/model/grow_cache.onnx);
- a new revision of the batch's tensors (gathered afresh, source axes cut) is copied in whole.
The host tensors remain the truth. The small inputs of a step (tokens, positions, masks) and replaced state
(an LSTM's h, c) are copied in every step; logits, attention and the new slots come back to the host, as
without IO binding. The graphs are written by export/common/server_graphs.py.

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

from attnserve.server.model.residency import Residency

CACHE_APPEND_GRAPH = pathlib.Path(__file__).with_name("cache_append.onnx")
WRITE_ROWS_GRAPH = pathlib.Path(__file__).with_name("write_rows.onnx")
GROW_CACHE_GRAPH = pathlib.Path(__file__).with_name("grow_cache.onnx")
COPY_ROWS_GRAPH = pathlib.Path(__file__).with_name("copy_rows.onnx")


@dataclasses.dataclass(eq=False)
class _Stack:
    """Tensors of one shape stacked in one device buffer: (len(names), *shape)."""

    names: tuple[str, ...]
    value: ort.OrtValue
    time_axis: int | None = None  # appended state: the tensors' time axis (the buffer's is one more)


@dataclasses.dataclass(eq=False)
class _Copies:
    """One batch's device copies."""

    revision: int
    cache_revision: int
    cache_length: int  # slots the appended-state copies hold
    static: list[_Stack]
    appended: list[_Stack]


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
        self._append = _open(CACHE_APPEND_GRAPH, decoder.get_providers())
        self._write_rows = _open(WRITE_ROWS_GRAPH, decoder.get_providers())
        self._grow_cache = _open(GROW_CACHE_GRAPH, decoder.get_providers())
        self._copy_rows = _open(COPY_ROWS_GRAPH, decoder.get_providers())
        self._kept: collections.OrderedDict[object, _Copies] = collections.OrderedDict()
        # Input name -> how many times it was copied to the device whole, and how many of its rows were
        # copied in alone (tests and benchmarks read them).
        self.uploads: collections.Counter[str] = collections.Counter()
        self.row_uploads: collections.Counter[str] = collections.Counter()
        self.device_row_copies: collections.Counter[str] = collections.Counter()  # rows copied on the device
        self.failed_steps = 0
        # Bytes copied from the host to the device, everything included (bench/device_transfers.py).
        self.uploaded_bytes = 0

    def run(self, feeds: Mapping[str, np.ndarray], residency: Residency) -> dict[str, np.ndarray]:
        """One decoder step; returns every output by name, on the host."""
        copies = self._copies(residency)
        appended = {name: x for name, (x, _, _) in residency.appended.items()}
        time_axes = {name: axis for name, (_, _, axis) in residency.appended.items()}
        if not copies.static:
            copies.static = self._upload(residency.static, {})
        elif residency.row_changes:
            self._change_rows(copies.static, residency.static, residency.row_changes)
        if not copies.appended:
            copies.appended = self._upload(appended, time_axes)
        elif residency.row_changes:
            self._change_rows(copies.appended, appended, residency.row_changes)
        binding = self._decoder.io_binding()
        bound = self._bind_stacks(binding, copies.static + copies.appended, feeds)
        for name, x in feeds.items():
            if name not in bound:
                binding.bind_cpu_input(name, np.ascontiguousarray(x))
                self.uploaded_bytes += x.nbytes
        for name in self._outputs:
            binding.bind_output(name, "cpu")
        self._decoder.run_with_iobinding(binding)
        outputs = dict(zip(self._outputs, binding.copy_outputs_to_cpu()))
        for stack in copies.appended:
            new = [outputs[residency.appended[name][1]] for name in stack.names]
            stack.value = self._write_slot(stack, new, residency.cache_length)
        copies.cache_length = residency.cache_length + 1
        return outputs

    def forget(self) -> None:
        """Drops every device copy after a failed step (it may have left them half updated)."""
        self.failed_steps += 1
        self._kept.clear()

    def _copies(self, residency: Residency) -> _Copies:
        """The owner's device copies still valid for this step (the others dropped), most recent last."""
        copies = self._kept.pop(residency.owner, None)
        if copies is None or copies.revision != residency.revision:
            copies = _Copies(residency.revision, residency.cache_revision, residency.cache_length, [], [])
        elif (copies.cache_revision, copies.cache_length) != (residency.cache_revision, residency.cache_length):
            growth = residency.cache_growth
            if copies.cache_revision + 1 == residency.cache_revision and growth and growth[1] == copies.cache_length:
                for stack in copies.appended:  # reallocated on the host: the same on the device
                    stack.value = self._grow(stack, growth)
            else:  # appended on the host alone, or more than one reallocation: stale
                copies.appended = []
            copies.cache_revision, copies.cache_length = residency.cache_revision, residency.cache_length
        self._kept[residency.owner] = copies
        while len(self._kept) > self.KEPT_BATCHES:
            self._kept.popitem(last=False)
        return copies

    def _upload(self, tensors: Mapping[str, np.ndarray], time_axes: Mapping[str, int]) -> list[_Stack]:
        """The tensors copied to the device whole, those of one shape (and time axis) in one stack."""
        groups: dict[tuple, list[str]] = {}
        for name, x in tensors.items():
            groups.setdefault((x.shape, time_axes.get(name)), []).append(name)
        stacks = []
        for (_, time_axis), names in groups.items():
            self.uploads.update(names)
            # np.stack copies, even where ORT would wrap a host array itself (on the CPU): the host tensors
            # change later, and a copy that followed them would hide a change the device copy missed.
            stacked = np.stack([tensors[name] for name in names])
            self.uploaded_bytes += stacked.nbytes
            value = ort.OrtValue.ortvalue_from_numpy(stacked, self._device, self._device_id)
            stacks.append(_Stack(tuple(names), value, time_axis))
        return stacks

    def _bind_stacks(self, binding: ort.IOBinding, stacks: list[_Stack], feeds: Mapping[str, np.ndarray]) -> set:
        """Binds, for each stacked tensor the decoder is fed, its first rows (those the feed has) by offset
        into its stack; returns the names bound."""
        bound = set()
        for stack in stacks:
            shape = stack.value.shape()
            block = int(np.prod(shape[1:])) * np.dtype(np.float32).itemsize
            for index, name in enumerate(stack.names):
                fed = feeds[name].shape
                if tuple(fed[1:]) != tuple(shape[2:]) or fed[0] > shape[1]:
                    raise RuntimeError(f"{name}: the decoder is fed {tuple(fed)} but its device copy is {shape[1:]}")
                binding.bind_input(name, self._device, self._device_id, np.float32, list(fed),
                                   stack.value.data_ptr() + index * block)
                bound.add(name)
        return bound

    def _change_rows(self, stacks: list[_Stack], tensors: Mapping[str, np.ndarray], changes) -> None:
        """Does the batch's row changes again on the device copies, in order: rows copied from others are
        copied there (nothing crosses to the device), rows written on the host are copied in from the host
        tensors at the end, as they are then. A copy from a row still to be copied in is copied in too."""
        pending: set[int] = set()
        for sources, targets in changes:
            if sources is None or pending.intersection(sources):
                pending.update(targets)
                continue
            for stack in stacks:
                self.device_row_copies.update({name: len(targets) for name in stack.names})
                index = {"sources": _stacked_rows(len(stack.names), sources),
                         "targets": _stacked_rows(len(stack.names), targets)}
                stack.value = self._run_on_device(self._copy_rows, index, "data", stack.value)
        if pending:
            self._rewrite_rows(stacks, tensors, tuple(sorted(pending)))

    def _rewrite_rows(self, stacks: list[_Stack], tensors: Mapping[str, np.ndarray], rows: tuple[int, ...]) -> None:
        """Copies the given rows (along each tensor's first axis) in again from the host tensors."""
        for stack in stacks:
            self.row_uploads.update({name: len(rows) for name in stack.names})
            values = np.concatenate([tensors[name][list(rows)] for name in stack.names])
            host = {"rows": _stacked_rows(len(stack.names), rows), "values": values}
            stack.value = self._run_on_device(self._write_rows, host, "data", stack.value)

    def _grow(self, stack: _Stack, growth: tuple[int, int, int]) -> ort.OrtValue:
        """The stacked buffers reallocated as AppendCache._grow does: slots cut..used kept, first, and spare
        (zero) slots after them up to the new capacity."""
        cut, used, capacity = growth
        axis = stack.time_axis + 1
        pads = np.zeros(2 * len(stack.value.shape()), dtype=np.int64)
        pads[len(stack.value.shape()) + axis] = capacity - (used - cut)
        host = {"start": np.array([cut]), "stop": np.array([used]), "axis": np.array([axis]), "pads": pads}
        return self._run_on_device(self._grow_cache, host, "past", stack.value)

    def _write_slot(self, stack: _Stack, new: list[np.ndarray], position: int) -> ort.OrtValue:
        """The stack with slot `position` along its tensors' time axis set to each one's new slot. The step ran
        the first rows; the other rows (free slots, rewritten whole before they are run) get zeros."""
        shape = stack.value.shape()
        axis = stack.time_axis + 1  # the stack's own axis comes first
        slot_shape = [1] * len(shape)
        slot_shape[axis] = shape[axis]
        slot = np.zeros(slot_shape, dtype=bool)
        slot.reshape(-1)[position] = True
        new = [np.take(x, [0], axis=axis - 1) for x in new]  # each output's first slot, if it has more
        padded = np.zeros((shape[0], shape[1], *new[0].shape[1:]), dtype=np.float32)
        for index, x in enumerate(new):
            padded[index, : len(x)] = x
        return self._run_on_device(self._append, {"slot": slot, "new": padded}, "past", stack.value)

    def _run_on_device(self, session: ort.InferenceSession, host: Mapping[str, np.ndarray], name: str,
                       value: ort.OrtValue) -> ort.OrtValue:
        """Runs a small graph on the host inputs and the device value `name`; its output stays on the device."""
        binding = session.io_binding()
        for key, x in host.items():
            binding.bind_cpu_input(key, np.ascontiguousarray(x))
            self.uploaded_bytes += x.nbytes
        binding.bind_ortvalue_input(name, value)
        binding.bind_output("updated", self._device, self._device_id)
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()  # the next graph to read it may run on another CUDA stream
        return binding.get_outputs()[0]


def _stacked_rows(tensors: int, rows) -> np.ndarray:
    """(tensors x len(rows), 2) (tensor, row) pairs, tensor-major: where the rows lie in a stack."""
    return np.stack(np.meshgrid(np.arange(tensors), np.asarray(rows), indexing="ij"), -1).reshape(-1, 2)


def _open(graph: pathlib.Path, providers: list[str]) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(graph), options, providers=providers)
