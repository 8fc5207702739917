"""The speech evaluations' submission loop (export/speech/evaluate.served_shortest_first): results in clip
order, clips submitted shortest first and never more than a chunk at once, a refusal raised or, when asked,
an empty reading."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from attnserve.export.speech.evaluate import served_shortest_first


class CountingEngine:
    """Answers each request (a clip index) with its square once collected; refuses the indices in `refuse`."""

    def __init__(self, refuse=()):
        self.refuse, self.submitted, self.outstanding, self.most_outstanding = set(refuse), [], 0, 0

    def submit(self, i: int) -> Future:
        if i in self.refuse:
            raise ValueError(f"clip {i} is too long")
        self.submitted.append(i)
        self.outstanding += 1
        self.most_outstanding = max(self.most_outstanding, self.outstanding)
        engine = self

        class Collected(Future):
            def result(self, timeout=None):
                engine.outstanding -= 1
                return i * i
        return Collected()


DURATIONS = [3.0, 1.0, 2.5, 0.5, 4.0, 2.0, 1.5]


def test_results_come_in_clip_order_submitted_shortest_first_a_chunk_at_a_time():
    engine = CountingEngine()
    results = served_shortest_first(engine, DURATIONS, lambda i: i, per_chunk=3)
    assert results == [i * i for i in range(len(DURATIONS))]
    assert engine.submitted == sorted(range(len(DURATIONS)), key=DURATIONS.__getitem__)
    assert engine.most_outstanding == 3


def test_a_refused_clip_raises_unless_refusals_are_empty_readings():
    with pytest.raises(ValueError, match="clip 4 is too long"):
        served_shortest_first(CountingEngine(refuse={4}), DURATIONS, lambda i: i, per_chunk=3)
    results = served_shortest_first(CountingEngine(refuse={4}), DURATIONS, lambda i: i, per_chunk=3,
                                    refused_as_none=True)
    assert results == [None if i == 4 else i * i for i in range(len(DURATIONS))]
