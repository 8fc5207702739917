"""Decoder inputs kept on the device between steps (IO binding, server/model/device_state.py), run on the CPU.

On the CPU provider the "device" is host memory, but every device copy is still a copy of its own, so a copy
the runtime failed to refresh would show. The decisive comparison: an engine with IO binding, under
continuous batching (rows joining, leaving, beams copied, buffers grown), gives what the plain engine gives
one request at a time (on every architecture, with every search: test_continuous_batching.py runs its
mid-flight comparisons both ways; here the cases it does not reach: buffers reallocated, rows written into
finished rows' slots, source axes cut, failed steps); and it really keeps the big inputs resident: the
encoder K/V and the K/V cache are copied in once, not at every step.
"""

from __future__ import annotations

import dataclasses
import threading

import grpc
import numpy as np
import pytest

from attnserve.export.common import server_graphs
from attnserve.api import convert
from attnserve.server.decoding import kv_cache
from attnserve.server.model.device_state import DeviceState
from attnserve.server.decoding.slots import Slots
from attnserve.server.edge import app
from attnserve.server.edge.serve_options import ServeOptions
from attnserve.server.engine.registry import load_engine
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from conftest import TINY_MODEL_NAME
from fakes import WAIT
from test_continuous_batching import (
    assert_same,
    assert_shared_requests_equal_alone,
    engines,
    text,
)

BOUND = RuntimeOptions(io_binding=True)


@pytest.mark.parametrize("name", server_graphs.GRAPHS)
def test_the_committed_graphs_are_what_the_generator_writes(name):
    assert (server_graphs.SERVER / name).read_bytes() == server_graphs.GRAPHS[name]().SerializeToString()


def test_io_binding_is_on_for_cuda_and_off_for_the_cpu_unless_asked():
    assert not RuntimeOptions().binds_io
    assert RuntimeOptions(io_binding=True).binds_io
    assert RuntimeOptions(device="cuda").binds_io
    assert not RuntimeOptions(device="cuda", io_binding=False).binds_io


def bound_and_alone(repo, name):
    return engines(repo, name, runtime=BOUND)


def test_the_cache_and_encoder_outputs_are_copied_in_once_not_every_step(tiny_model_repo):
    bound, alone = bound_and_alone(tiny_model_repo, TINY_MODEL_NAME)
    steps = 2 * kv_cache.SPARE_SLOTS + 4
    request = text(TINY_MODEL_NAME, 0, new=steps, at_least=steps)
    try:
        result = bound.generate(request, WAIT)
        assert_same(result, alone.generate(request, WAIT))
    finally:
        bound.close()
        alone.close()
    manifest = find_models(tiny_model_repo)[TINY_MODEL_NAME].manifest
    uploads = bound.runtime.device_state.uploads
    assert len(result.tokens) == steps
    floats = [s.target for s in manifest.static
              if bound.runtime.decoder_signature.inputs[s.target].dtype == "float32"]  # the encoder K/V
    assert floats
    # Copied in once, at the first step: the cache's buffers were reallocated twice since, on the device too.
    for name in floats + [s.input for s in manifest.state]:
        assert uploads[name] == 1, name
    assert bound.runtime.device_state.failed_steps == 0


def test_a_step_failing_on_the_device_drops_the_copies_and_its_requests_retry_alone(tiny_model_repo, monkeypatch):
    bound, alone = bound_and_alone(tiny_model_repo, TINY_MODEL_NAME)
    write_slot, failed = DeviceState._write_slot, []

    def flaky(self, stack, new, position):  # the first shared step, after the decoder ran: copies left behind
        if not failed and len(new[0]) > 1:
            failed.append(True)
            raise RuntimeError("injected")
        return write_slot(self, stack, new, position)

    monkeypatch.setattr(DeviceState, "_write_slot", flaky)
    assert_shared_requests_equal_alone(bound, alone)
    assert failed


def test_a_batch_whose_longest_source_leaves_is_cut_and_equals_the_plain_engine_alone(tiny_model_repo,
                                                                                     monkeypatch):
    bound, alone = bound_and_alone(tiny_model_repo, TINY_MODEL_NAME)
    narrowed, narrow = [], Slots.narrow
    monkeypatch.setattr(Slots, "narrow", lambda self, width: narrowed.append(width) or narrow(self, width))
    # Text 4 is the longest source; it stops after two tokens, and the batch's source axes are cut.
    trigger = text(TINY_MODEL_NAME, 3, new=20, at_least=20)
    late = [text(TINY_MODEL_NAME, 4, new=2, at_least=2), text(TINY_MODEL_NAME, 5, new=12, at_least=12)]
    assert_shared_requests_equal_alone(bound, alone, trigger, late)
    assert narrowed
    assert bound.runtime.device_state.failed_steps == 0


def test_a_stale_copy_would_show(tiny_model_repo):
    """The comparisons above can fail: a device state that misses the rows changed on the host (keeps what
    its copies held before beams were copied) fails or gives other output."""
    bound, alone = bound_and_alone(tiny_model_repo, TINY_MODEL_NAME)
    state = bound.runtime.device_state
    run = state.run
    state.run = lambda feeds, residency: run(feeds, dataclasses.replace(residency, row_changes=()))
    request = text(TINY_MODEL_NAME, 4, beam=3, new=kv_cache.SPARE_SLOTS - 2, at_least=kv_cache.SPARE_SLOTS - 2)
    try:
        plain = alone.generate(request, WAIT)
        try:
            stale = bound.generate(request, WAIT)
        except Exception:
            return  # the copies no longer even have the rows' shapes
    finally:
        bound.close()
        alone.close()
    assert [t.id for t in stale.tokens] != [t.id for t in plain.tokens] or not np.allclose(
        stale.attention.weights, plain.attention.weights, atol=1e-3)


def test_a_newcomer_written_into_a_finished_rows_slot_equals_the_plain_engine_alone(tiny_model_repo):
    """Rows leave their slots free and a newcomer takes one below the batch's size (no reallocation)."""
    bound, alone = bound_and_alone(tiny_model_repo, TINY_MODEL_NAME)
    long = [text(TINY_MODEL_NAME, i, new=24, at_least=24) for i in (0, 2, 4, 6)]
    short, newcomer = text(TINY_MODEL_NAME, 1, new=2, at_least=2), text(TINY_MODEL_NAME, 3, new=6, at_least=6)
    futures, joined = {}, threading.Event()

    def admit(token):  # the first long request's callback, on the worker
        if token.index == 1:
            futures.update({i: bound.submit(r) for i, r in enumerate([*long[1:], short], start=1)})
        elif "newcomer" not in futures and 4 in futures and futures[4].done():
            # The short one has left its slot free (waiting for it, not for a step count: on a busy machine
            # the others may join the running batch a few steps late).
            futures["newcomer"] = bound.submit(newcomer)
            joined.set()

    try:
        futures[0] = bound.submit(long[0], admit)
        assert joined.wait(WAIT)
        requests = {0: long[0], 1: long[1], 2: long[2], 3: long[3], 4: short, "newcomer": newcomer}
        for key, request in requests.items():
            assert_same(futures[key].result(WAIT), alone.generate(request, WAIT))
        assert futures[4].result(WAIT).timings.batch_size >= 4
        # The newcomer's rows were written into the device copies, not the copies made again.
        assert all(bound.runtime.device_state.row_uploads[name] for name in bound.runtime.device_state.uploads)
        assert bound.runtime.device_state.failed_steps == 0
    finally:
        bound.close()
        alone.close()


def test_the_serve_flag_reaches_the_runtime():
    from test_continuous_batching import parse_serve_flags

    assert [parse_serve_flags(*flags).io_binding for flags in ((), ("--io-binding", "on"))] == ["auto", "on"]
    with pytest.raises(ValueError, match="--io-binding 'yes' is not one of auto, on, off"):
        ServeOptions(io_binding="yes")


@pytest.mark.parametrize("engine_process", [False, True], ids=["one process", "engine process"])
def test_served_with_io_binding_on_equals_the_plain_engine_offline(tiny_model_repo, engine_process):
    request = text(TINY_MODEL_NAME, 0, new=kv_cache.SPARE_SLOTS + 4, at_least=kv_cache.SPARE_SLOTS + 4)
    plain = load_engine(find_models(tiny_model_repo)[TINY_MODEL_NAME])
    try:
        offline = plain.generate(request, WAIT)
    finally:
        plain.close()
    engines = app.load_engines(ServeOptions(models=str(tiny_model_repo), io_binding="on",
                                            engine_process=engine_process))
    if not engine_process:
        assert engines[TINY_MODEL_NAME].runtime.device_state is not None
    with app.BackgroundServer(engines) as background, grpc.insecure_channel(background.address) as channel:
        stub = pb_grpc.AttnServeStub(channel)
        message = convert.request_to_proto(request)
        served = stub.Generate(message, timeout=WAIT)
        streamed = list(stub.GenerateStream(message, timeout=WAIT))
    assert served.text == streamed[-1].response.text == offline.text
    assert [t.id for t in served.tokens] == [t.id for t in offline.tokens]


@pytest.mark.parametrize("seed", range(3))
def test_row_changes_done_again_on_the_device_leave_it_equal_to_the_host(tiny_model_repo, seed):
    """Rows written on the host and rows copied, some copies from rows written earlier in the same sequence
    (those must come from the host), replayed on a device stack of two tensors."""
    bound = load_engine(find_models(tiny_model_repo)[TINY_MODEL_NAME], BOUND)
    state = bound.runtime.device_state
    bound.close()
    rng = np.random.default_rng(seed)
    host = {name: rng.standard_normal((6, 2, 3)).astype(np.float32) for name in ("a", "b")}
    stacks = state._upload(host, {})
    # (sources or None for a write, targets): copied on the device unless a source was written before.
    changes = [((0, 1), (2, 3)), (None, (4,)), ((4,), (5,)), ((0,), (1,)), (None, (2,)), ((2,), (0,))]
    for sources, targets in changes:
        for x in host.values():
            if sources is None:
                x[list(targets)] = rng.standard_normal((len(targets), 2, 3))
            else:
                x[list(targets)] = x[list(sources)]
    state._change_rows(stacks, host, tuple(changes))
    np.testing.assert_array_equal(stacks[0].value.numpy(), np.stack([host["a"], host["b"]]))
    assert state.device_row_copies["a"] == 3 and state.row_uploads["a"] == 4  # rows 4, 5, 2, 0 from the host
