"""The K/V cache written in place (server/decoding/kv_cache.py) and the slots rows live in (server/decoding/slots.py): the decoder
reads the same buffers step after step, their spare slots change nothing it computes, rows merged, dropped,
repeated or split off keep their own slots, and only the rows that change are copied."""

from __future__ import annotations

import numpy as np
import pytest

from attnserve.server.decoding import kv_cache
from attnserve.server.decoding.batch import Batch
from attnserve.server.inputs.preprocessing import TextPreprocessor, TextSource
from attnserve.server.model.repository import find_models, open_runtime

ATOL = 1e-5
SOURCES = [(7, 8, 9, 10, 11, 12), (13, 14, 15), (16, 17, 18, 19, 20, 21, 22, 23, 24)]


class RecordingRuntime:
    """The real runtime, keeping every decoder feed it was given (the arrays themselves, and a copy of
    each as it was at the call: the cache writes its buffers in place afterwards)."""

    def __init__(self, runtime):
        self._runtime = runtime
        self.feeds: list[dict[str, np.ndarray]] = []
        self.values: list[dict[str, np.ndarray]] = []

    def encode(self, feeds):
        return self._runtime.encode(feeds)

    def decode_step(self, feeds, residency=None):
        self.feeds.append(dict(feeds))
        self.values.append({k: v.copy() for k, v in feeds.items()})
        return self._runtime.decode_step(feeds, residency)


@pytest.fixture(scope="module")
def model(tiny_model_repo):
    version = find_models(tiny_model_repo)["tiny-translate"]
    return version.manifest, open_runtime(version)


def build(manifest, runtime, sources) -> Batch:
    return Batch.build(manifest, runtime, TextPreprocessor(manifest, None).collate([TextSource(s) for s in sources]))


def appended(manifest) -> list[str]:
    return [s.input for s in manifest.state if s.update == "append"]


def reference_steps(manifest, runtime, sources, tokens: np.ndarray):
    """Logits and attention of every step, the cache grown by concatenation to exactly its length."""
    batch = build(manifest, runtime, sources)  # only for its static (encoder) inputs
    d, names = manifest.decoder, appended(manifest)
    specs = {s.input: s for s in manifest.state}
    cache = {}  # name -> (B, ..., T, ...): starts empty, as the batch's buffers (their time axis cut to 0)
    for name, buffer in batch.slots.cache.feeds()[0].items():
        shape = list(buffer.shape)
        shape[specs[name].time_axis] = 0
        cache[name] = np.zeros(shape, np.float32)
    b = len(sources)
    results = []
    for step, token in enumerate(tokens):
        feeds = {**batch.slots.static, **cache, d.input_ids: np.full((b, 1), token, dtype=np.int64),
                 d.position_ids: np.full((b, 1), step, dtype=np.int64),
                 d.self_attention_mask: np.ones((b, step + 1), dtype=np.int64)}
        out = runtime.decode_step(feeds)
        for name in names:
            cache[name] = np.concatenate([cache[name], out[specs[name].output]], specs[name].time_axis)
        results.append((out[d.logits], out[manifest.attention.output]))
    return results


def test_steps_reuse_the_buffers_until_they_fill(model):
    manifest, runtime = model
    recording = RecordingRuntime(runtime)
    batch = build(manifest, recording, SOURCES)
    steps = kv_cache.SPARE_SLOTS + 2
    for _ in range(steps):
        batch.step(np.full(len(SOURCES), 9))
    name, axis = appended(manifest)[0], next(s.time_axis for s in manifest.state if s.update == "append")
    buffers = [f[name] for f in recording.feeds]
    memory = [b.__array_interface__["data"][0] for b in buffers]  # the decoder is fed views of the buffer
    first = kv_cache.SPARE_SLOTS
    # One buffer for the first SPARE_SLOTS steps, then one SPARE_SLOTS longer: no copy per step.
    assert all(m == memory[0] for m in memory[:first]) and buffers[0].shape[axis] == first
    assert memory[first] != memory[0] and buffers[first].shape[axis] == 2 * first
    assert all(m == memory[first] for m in memory[first:])
    # The mask shows each step the slots written so far and its own token (the last column), nothing else.
    for step, feeds in enumerate(recording.values):
        mask = feeds[manifest.decoder.self_attention_mask]
        capacity = mask.shape[1] - 1
        want = np.zeros((len(SOURCES), capacity + 1), dtype=np.int64)
        want[:, :step] = 1
        want[:, capacity] = 1
        np.testing.assert_array_equal(mask, want)


def test_spare_slots_change_nothing_the_decoder_computes(model):
    manifest, runtime = model
    tokens = np.array([4, 9, 10, 11, 12, 13, 9, 9, 14, 15] * 2)  # 20 steps: the buffers grow once
    want = reference_steps(manifest, runtime, SOURCES, tokens)
    batch = build(manifest, runtime, SOURCES)
    for step, token in enumerate(tokens):
        got = batch.step(np.full(len(SOURCES), token))
        np.testing.assert_allclose(got.logits, want[step][0], atol=ATOL)
        np.testing.assert_allclose(got.attention, want[step][1], atol=ATOL)


def test_merged_dropped_and_repeated_rows_keep_their_own_slots(model):
    """Rows joining a running batch late, leaving it and being repeated (beams) compute what they would
    alone, across buffer growth."""
    manifest, runtime = model
    tokens = np.array([4, 9, 10, 11, 12, 13, 9, 9, 14, 15] * 3)
    alone = [reference_steps(manifest, runtime, [s], tokens) for s in SOURCES]
    late = 5
    batch = build(manifest, runtime, SOURCES[:2])
    for step in range(late):
        batch.step(np.full(2, tokens[step]))
    batch.merge(build(manifest, runtime, SOURCES[2:]))
    rows, starts = np.array([0, 1, 2]), np.array([0, 0, late])  # each batch row's source and first step
    for step in range(late, len(tokens)):
        row_steps = step - starts
        got = batch.step(tokens[row_steps])
        for row, source in enumerate(rows):
            np.testing.assert_allclose(got.logits[row], alone[source][row_steps[row]][0][0], atol=ATOL)
        if step == 12:
            keep = [1, 2]  # row 0 leaves
            batch.select(keep)
        elif step == 16:
            keep = [1, 1]  # only the late row, twice, as beams would
            batch.select(keep)
        else:
            continue
        rows, starts = rows[keep], starts[keep]
    # The late row was left-padded by 5 slots; once the rows that used them left, the padding went too.
    assert batch.self_mask.shape == (2, len(tokens) - late) and batch.self_mask.all()


def data_address(x: np.ndarray) -> int:
    return x.__array_interface__["data"][0]


def test_a_newcomer_takes_a_finished_rows_slot_and_the_others_stay_put(model):
    """Continuous batching's usual step: a row finishes, another joins. The newcomer is written into the freed
    slot (server/decoding/slots.py) while the rows that stay are not copied, and every row computes what it would alone."""
    manifest, runtime = model
    tokens = np.array([4, 9, 10, 11, 12, 13, 9, 9, 14, 15] * 2)
    alone = [reference_steps(manifest, runtime, [s], tokens) for s in SOURCES]
    rows, starts = np.array([0, 2, 1, 0, 2]), np.zeros(5, dtype=np.int64)  # each row's source and first step
    batch = build(manifest, runtime, [SOURCES[i] for i in rows])
    static = manifest.static[1].target  # a cross-attention K tensor
    for step in range(len(tokens)):
        if step == 4:  # row 0 leaves, a row of source 1 joins: it takes row 0's slot
            before = data_address(batch.slots.static[static]), batch.slots.size
            batch.select(np.arange(1, 5))
            batch.merge(build(manifest, runtime, [SOURCES[1]]))
            rows, starts = np.append(rows[1:], 1), np.append(starts[1:], step)
            assert (data_address(batch.slots.static[static]), batch.slots.size) == before
            np.testing.assert_array_equal(batch.slot_of_rows, [1, 2, 3, 4, 0])
        if step == 9:  # three rows leave: the last row's slot moves into a hole, the decoder runs 2 slots
            batch.select(np.array([0, 4]))
            rows, starts = rows[[0, 4]], starts[[0, 4]]
            assert batch.slots.size == 2 and sorted(batch.slot_of_rows) == [0, 1]
        row_steps = step - starts
        got = batch.step(tokens[row_steps])
        for row, source in enumerate(rows):
            np.testing.assert_allclose(got.logits[row], alone[source][row_steps[row]][0][0], atol=ATOL)
            width = len(SOURCES[source])
            np.testing.assert_allclose(got.attention[row][..., :width], alone[source][row_steps[row]][1][0], atol=ATOL)


def test_a_batch_keeps_no_spare_slots_past_its_row_limit(model):
    """Fresh tensors made for newcomers get spare slots for later ones, but never past the scheduler's row
    limit (`max_rows`, set by the batch's lane): no row could take them, and at 64 rows they were a third of
    the batch's memory. The rows still compute what they would alone."""
    manifest, runtime = model
    tokens = np.array([4, 9, 10, 11, 12, 13, 9, 9])
    alone = [reference_steps(manifest, runtime, [s], tokens) for s in SOURCES]
    late = 3
    batch = build(manifest, runtime, SOURCES[:2])
    batch.max_rows = 4
    for step in range(late):
        batch.step(np.full(2, tokens[step]))
    batch.merge(build(manifest, runtime, SOURCES[2:] * 2))  # a longer source: every row into fresh tensors
    assert batch.slots.size == 4 and batch.slots.capacity == 4  # not 4 + spare slots
    rows, starts = [0, 1, 2, 2], np.array([0, 0, late, late])
    for step in range(late, len(tokens)):
        row_steps = step - starts
        got = batch.step(tokens[row_steps])
        for row, source in enumerate(rows):
            np.testing.assert_allclose(got.logits[row], alone[source][row_steps[row]][0][0], atol=ATOL)

    unlimited = build(manifest, runtime, SOURCES[:2])
    unlimited.merge(build(manifest, runtime, SOURCES[2:] * 2))
    assert unlimited.slots.capacity > 4  # without a limit the spare slots are there


def test_a_beam_kept_twice_is_copied_into_a_free_slot(model):
    """Beam search keeps a row twice: the copy goes into a slot a dropped beam freed, not into fresh tensors,
    and both copies then compute what the row would alone."""
    manifest, runtime = model
    tokens = np.array([4, 9, 10, 11, 12, 13, 9, 9, 14, 15])
    alone = reference_steps(manifest, runtime, [SOURCES[2]], tokens)
    batch = build(manifest, runtime, [SOURCES[2]] * 4)
    static = manifest.static[1].target
    for step in range(len(tokens)):
        if step == 3:
            before = data_address(batch.slots.static[static])
            batch.select(np.array([2, 2, 0, 3]))  # beam 1 dropped, beam 2 kept twice
            assert data_address(batch.slots.static[static]) == before and batch.slots.size == 4
            assert sorted(batch.slot_of_rows) == [0, 1, 2, 3]
        got = batch.step(np.full(len(batch), tokens[step]))
        for row in range(len(batch)):
            np.testing.assert_allclose(got.logits[row], alone[step][0][0], atol=ATOL)


def test_the_source_axis_narrows_when_the_longest_rows_leave(model):
    """The decoder attends every source position its tensors hold: once the long rows have left, the
    static tensors are cut to what the remaining rows need, and they compute what they would alone."""
    manifest, runtime = model
    tokens = np.array([4, 9, 10, 11, 12, 13, 9, 9, 14, 15])
    alone = reference_steps(manifest, runtime, [SOURCES[1]], tokens)
    batch = build(manifest, runtime, [SOURCES[2], SOURCES[1], SOURCES[2], SOURCES[1]])
    for step in range(len(tokens)):
        if step == 3:
            assert batch.slots.width == len(SOURCES[2])
            batch.select(np.array([1, 3]))  # the 9-token sources leave, the 3-token ones stay
            assert batch.slots.width == len(SOURCES[1])
        got = batch.step(np.full(len(batch), tokens[step]))
        if step >= 3:
            for row in range(len(batch)):
                np.testing.assert_allclose(got.logits[row], alone[step][0][0], atol=ATOL)


@pytest.mark.parametrize("seed", range(4))
def test_random_joins_leaves_repeats_and_splits_keep_every_row_equal_to_alone(model, seed):
    """Continuous batching in miniature, at random: rows join (merged fresh batches), leave (filters), are kept
    twice (beam-like selects) and move to another batch (split) at random steps, so slots are freed, reused,
    copied, compacted, narrowed and regathered in every order. Every row's logits at every step equal its
    source's alone."""
    manifest, runtime = model
    rng = np.random.default_rng(seed)
    tokens = np.array([4, 9, 10, 11, 12, 13, 9, 9, 14, 15] * 3)
    sources = SOURCES + [(25, 26), (27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38), (39,)]
    alone = [reference_steps(manifest, runtime, [s], tokens) for s in sources]

    def fresh(count):
        picked = rng.integers(len(sources), size=count)
        return build(manifest, runtime, [sources[i] for i in picked]), picked

    batch, rows = fresh(4)
    starts = np.zeros(len(rows), dtype=np.int64)  # the step each row joined
    checked = 0
    for step in range(40):
        old = step - starts >= len(tokens) - 1  # rows about to run out of reference steps leave
        if old.any():
            keep = np.flatnonzero(~old)
            batch.select(keep)
            rows, starts = rows[keep], starts[keep]
        action = rng.choice(["join", "leave", "repeat", "split", "none"], p=[0.3, 0.2, 0.15, 0.1, 0.25])
        if action == "join" or len(rows) == 0:
            newcomers, picked = fresh(int(rng.integers(1, 4)))
            batch.merge(newcomers)
            rows, starts = np.concatenate([rows, picked]), np.concatenate([starts, np.full(len(picked), step)])
        elif action == "leave":
            keep = np.flatnonzero(rng.random(len(rows)) < 0.7)
            batch.select(keep)
            rows, starts = rows[keep], starts[keep]
        elif action == "repeat":
            keep = np.sort(rng.integers(len(rows), size=len(rows)))
            batch.select(keep)
            rows, starts = rows[keep], starts[keep]
        elif action == "split" and len(rows) > 1:
            moved = np.flatnonzero(rng.random(len(rows)) < 0.5)
            other = batch.split(moved)
            stay = np.setdiff1d(np.arange(len(rows)), moved)
            if rng.random() < 0.5:  # continue with the moved rows instead
                batch, stay = other, moved
            rows, starts = rows[stay], starts[stay]
        if len(rows) == 0:
            continue
        row_steps = step - starts
        got = batch.step(tokens[row_steps])
        for row, (source, at) in enumerate(zip(rows, row_steps)):
            np.testing.assert_allclose(got.logits[row], alone[source][at][0][0], atol=ATOL,
                                       err_msg=f"step {step}, row {row} (source {source}, its step {at})")
            width = len(sources[source])
            np.testing.assert_allclose(got.attention[row][..., :width], alone[source][at][1][0], atol=ATOL)
            checked += 1
    assert checked > 100
