"""The dynamic batcher with a fake processor: grouping, queue bound, failure isolation, streaming,
cancellation, close."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError

import pytest

from attnserve.server.engine.batcher import Batcher, BatchingOptions
from attnserve.api.generation import OverloadedError, UnavailableError

WAIT = 10  # seconds; only a bound against hanging, never asserted on


class Recorder:
    """A processor that records the groups it gets and answers payload -> payload * 10.

    Payload "bad" raises; payload "block" waits for `release` first; "raise-after-first" answers the
    item before it in the group and then raises.
    """

    def __init__(self):
        self.groups: list[list] = []
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, items):
        payloads = [item.payload for item in items]
        self.groups.append(payloads)
        for index, item in enumerate(items):
            if item.payload == "block":
                self.started.set()
                assert self.release.wait(WAIT)
            for token in range(2):
                item.emit(f"{item.payload}:{token}")
        if "bad" in payloads:
            for index, payload in enumerate(payloads):
                if payload != "bad":
                    yield index, payload * 2
                    break
            raise RuntimeError("bad payload")
        for index, payload in enumerate(payloads):
            yield index, payload * 2


def blocked(recorder, **options) -> Batcher:
    """A batcher whose worker is busy with a 'block' item until recorder.release is set."""
    batcher = Batcher(recorder, BatchingOptions(**options), name="test")
    batcher.submit("block")
    assert recorder.started.wait(WAIT)
    return batcher


def test_requests_queued_together_share_one_batch():
    recorder = Recorder()
    batcher = blocked(recorder)
    futures = [batcher.submit(f"r{i}") for i in range(8)]
    recorder.release.set()
    assert [f.result(WAIT) for f in futures] == [f"r{i}r{i}" for i in range(8)]
    assert recorder.groups == [["block"], [f"r{i}" for i in range(8)]]
    batcher.close()


def test_max_batch_size_splits_the_queue():
    recorder = Recorder()
    batcher = blocked(recorder, max_batch_size=4)
    futures = [batcher.submit(i) for i in range(10)]
    recorder.release.set()
    assert [f.result(WAIT) for f in futures] == [2 * i for i in range(10)]
    assert [len(g) for g in recorder.groups] == [1, 4, 4, 2]
    batcher.close()


def test_the_window_waits_for_a_late_request():
    # A long window, closed early because the batch fills: the first request waited for the second.
    recorder = Recorder()
    batcher = Batcher(recorder, BatchingOptions(max_batch_size=2, window_ms=60000.0), name="test")
    first = batcher.submit(1)
    second = batcher.submit(2)
    assert (first.result(WAIT), second.result(WAIT)) == (2, 4)
    assert recorder.groups == [[1, 2]]
    batcher.close()


def test_the_window_closes_without_more_requests():
    recorder = Recorder()
    batcher = Batcher(recorder, BatchingOptions(window_ms=10.0), name="test")
    assert batcher.submit(3).result(WAIT) == 6
    assert recorder.groups == [[3]]
    batcher.close()


def test_a_full_queue_raises_overloaded():
    recorder = Recorder()
    batcher = blocked(recorder, max_queue_size=2)
    kept = [batcher.submit(1), batcher.submit(2)]
    with pytest.raises(OverloadedError, match="2 requests queued"):
        batcher.submit(3)
    assert batcher.queued() == 2
    recorder.release.set()
    assert [f.result(WAIT) for f in kept] == [2, 4]
    batcher.close()


def test_a_failing_request_fails_alone():
    recorder = Recorder()
    batcher = blocked(recorder)
    futures = [batcher.submit(p) for p in ("a", "bad", "c", "d")]
    recorder.release.set()
    with pytest.raises(RuntimeError, match="bad payload"):
        futures[1].result(WAIT)
    assert [futures[i].result(WAIT) for i in (0, 2, 3)] == ["aa", "cc", "dd"]
    # "a" was answered before the batch raised, so only the rest are retried, one by one.
    assert recorder.groups[1:] == [["a", "bad", "c", "d"], ["bad"], ["c"], ["d"]]
    batcher.close()


def test_tokens_stream_once_even_when_a_batch_is_retried():
    recorder = Recorder()
    batcher = blocked(recorder)
    streams = {p: [] for p in ("x", "bad", "y")}
    futures = [batcher.submit(p, on_token=streams[p].append) for p in ("x", "bad", "y")]
    recorder.release.set()
    assert futures[0].result(WAIT) == "xx" and futures[2].result(WAIT) == "yy"
    assert futures[1].exception(WAIT) is not None
    assert recorder.groups[1:] == [["x", "bad", "y"], ["bad"], ["y"]]
    # "bad" and "y" ran twice but streamed each token once.
    assert streams == {"x": ["x:0", "x:1"], "bad": ["bad:0", "bad:1"], "y": ["y:0", "y:1"]}
    batcher.close()


def test_results_arrive_as_each_request_finishes():
    started, release, gate = threading.Event(), threading.Event(), threading.Event()

    def process(items):
        if items[0].payload == "block":  # keeps the worker busy until a and b are queued
            started.set()
            assert release.wait(WAIT)
            yield 0, None
            return
        yield 1, "early"
        assert gate.wait(WAIT)
        yield 0, "late"

    batcher = Batcher(process, BatchingOptions(), name="test")
    batcher.submit("block")
    assert started.wait(WAIT)
    futures = [batcher.submit("a"), batcher.submit("b")]
    release.set()
    assert futures[1].result(WAIT) == "early"  # while request 0 is still running
    assert not futures[0].done()
    gate.set()
    assert futures[0].result(WAIT) == "late"
    batcher.close()


def test_a_request_left_unanswered_gets_an_error():
    batcher = Batcher(lambda items: iter(()), BatchingOptions(window_ms=0.0), name="test")
    with pytest.raises(RuntimeError, match="without an answer"):
        batcher.submit(1).result(WAIT)
    batcher.close()


def test_cancelled_requests_are_skipped():
    recorder = Recorder()
    batcher = blocked(recorder)
    dropped, kept = batcher.submit("gone"), batcher.submit("kept")
    batcher.cancel(dropped)
    assert dropped.cancelled()
    recorder.release.set()
    assert kept.result(WAIT) == "keptkept"
    with pytest.raises(CancelledError):
        dropped.result(WAIT)
    assert recorder.groups[1] == ["kept"]
    batcher.close()


def held_pair(process) -> tuple[Batcher, threading.Event, threading.Event]:
    """A batcher whose first batch, of two items, waits for `release` and then runs `process(items)`."""
    started, release = threading.Event(), threading.Event()

    def run(items):
        started.set()
        assert release.wait(WAIT)
        yield from process(items)

    return Batcher(run, BatchingOptions(max_batch_size=2, window_ms=60000.0), name="test"), started, release


def test_a_running_request_is_cancelled_through_its_mark():
    def process(items):  # a processor that checks the mark between steps, as the engine does
        for index, item in enumerate(items):
            yield index, CancelledError() if item.cancelled else item.payload

    batcher, started, release = held_pair(process)
    gone, kept = batcher.submit("gone"), batcher.submit("kept")
    assert started.wait(WAIT)
    batcher.cancel(gone)
    assert not gone.done()  # running: only the processor can end it
    release.set()
    with pytest.raises(CancelledError):
        gone.result(WAIT)
    assert kept.result(WAIT) == "kept"
    batcher.cancel(kept)  # answered: a no-op
    assert kept.result(WAIT) == "kept"
    batcher.close()


def test_a_request_cancelled_in_a_failed_batch_is_not_retried():
    groups = []

    def process(items):
        groups.append([item.payload for item in items])
        raise RuntimeError("bad batch")
        yield

    batcher, started, release = held_pair(process)
    gone, bad = batcher.submit("gone"), batcher.submit("bad")
    assert started.wait(WAIT)
    batcher.cancel(gone)
    release.set()
    with pytest.raises(RuntimeError, match="bad batch"):
        bad.result(WAIT)
    with pytest.raises(CancelledError):
        gone.result(WAIT)
    assert groups == [["gone", "bad"], ["bad"]]
    batcher.close()


def test_close_fails_queued_work_and_finishes_the_running_batch():
    recorder = Recorder()
    batcher = Batcher(recorder, BatchingOptions(window_ms=0.0), name="test")
    running = batcher.submit("block")
    assert recorder.started.wait(WAIT)
    queued = batcher.submit("later")
    closer = threading.Thread(target=batcher.close)
    closer.start()
    with pytest.raises(UnavailableError, match="shut down before the request ran"):
        queued.result(WAIT)
    with pytest.raises(UnavailableError, match="shutting down"):
        batcher.submit("too late")
    recorder.release.set()
    assert running.result(WAIT) == "blockblock"
    closer.join(WAIT)
    assert not closer.is_alive()


def test_options_are_validated():
    with pytest.raises(ValueError, match="max_batch_size must be at least 1"):
        BatchingOptions(max_batch_size=0)
    with pytest.raises(ValueError, match="window_ms must be at least 0"):
        BatchingOptions(window_ms=-1)
