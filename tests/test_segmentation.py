"""server/inputs/segmentation.py: recordings with known pauses are cut in them, and no segment outgrows the window."""

from __future__ import annotations

import numpy as np
import pytest

from attnserve.server.inputs.segmentation import (
    FRAME_SECONDS,
    EnergyDetector,
    Segment,
    SegmentationOptions,
    WebRtcDetector,
    segment,
    speech_regions,
)
from speech_clips import RATE, espeak, recording

TONE_SECONDS = [1.2, 0.6, 2.5, 0.9]
PAUSES = [0.7, 1.0, 0.8, 1.5, 0.6]


def tone(seconds: float, hz: float) -> np.ndarray:
    t = np.arange(round(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * hz * t) * np.minimum(1, np.minimum(t, seconds - t) / 0.01)).astype(np.float32)


def test_tones_between_pauses_are_cut_in_every_pause():
    clips = [tone(s, 220 * (i + 1)) for i, s in enumerate(TONE_SECONDS)]
    x, spans = recording(clips, PAUSES, noise=1e-4)
    options = SegmentationOptions(max_seconds=20, padding_seconds=0.1)
    segments = segment(x, RATE, options, EnergyDetector())
    assert len(segments) == len(spans)
    for seg, (start, end) in zip(segments, spans):
        s, e = seg.seconds(RATE)
        # Within a frame of the tone's edges, plus the padding (a frame is 30 ms).
        assert abs(s - (start - 0.1)) <= FRAME_SECONDS + 1e-9 and abs(e - (end + 0.1)) <= FRAME_SECONDS + 1e-9


def test_short_pauses_stay_inside_a_segment_and_packing_joins_neighbours():
    clips = [tone(s, 330) for s in TONE_SECONDS]
    x, spans = recording(clips, [0.5, 0.2, 1.0, 0.3, 0.5], noise=1e-4)
    options = SegmentationOptions(max_seconds=20, min_pause_seconds=0.5)
    cut = segment(x, RATE, options, EnergyDetector())
    assert len(cut) == 2  # the 0.2 s and 0.3 s pauses are bridged
    assert cut[0].end / RATE < spans[2][0] and cut[1].start / RATE > spans[1][1]
    packed = segment(x, RATE, SegmentationOptions(max_seconds=20, pack_seconds=20), EnergyDetector())
    assert len(packed) == 1 and packed[0].start / RATE < spans[0][0] and packed[0].end / RATE > spans[-1][1]


def test_a_region_longer_than_the_window_is_cut_at_its_quietest_frame():
    # 9 s of tone whose level dips at 3.5 s and 6.6 s: a 4-s window cuts at the dips.
    t = np.arange(9 * RATE) / RATE
    level = 0.3 - 0.27 * (np.exp(-((t - 3.5) / 0.05) ** 2) + np.exp(-((t - 6.6) / 0.05) ** 2))
    x = (level * np.sin(2 * np.pi * 200 * t)).astype(np.float32)
    cut = segment(x, RATE, SegmentationOptions(max_seconds=4), EnergyDetector(range_db=60))
    assert [round(s.end / RATE, 1) for s in cut[:-1]] == [3.5, 6.6]
    assert all(s.end - s.start <= 4 * RATE for s in cut)
    assert cut[0].start == 0 and cut[-1].end == len(x) and all(a.end == b.start for a, b in zip(cut, cut[1:]))


def test_a_cut_never_leaves_a_sliver_behind():
    x = (0.3 * np.sin(2 * np.pi * 200 * np.arange(round(4.01 * RATE)) / RATE)).astype(np.float32)
    cut = segment(x, RATE, SegmentationOptions(max_seconds=4, padding_seconds=0), EnergyDetector())
    assert len(cut) == 2 and all(s.end - s.start >= 4 * FRAME_SECONDS * RATE for s in cut)
    assert all(s.end - s.start <= 4 * RATE for s in cut)


def test_silence_gives_no_segment():
    x = np.zeros(5 * RATE, dtype=np.float32)
    assert segment(x, RATE, SegmentationOptions(max_seconds=20), EnergyDetector()) == []


def test_runs_shorter_than_min_speech_are_dropped_and_pauses_bridged():
    speech = np.array([0, 1, 0, 0, 1, 1, 1, 0, 1, 1, 0, 0, 0, 0, 1, 1], dtype=bool)
    assert speech_regions(speech, min_pause=3, min_speech=2) == [(4, 10), (14, 16)]


def test_options_that_cannot_work_are_refused():
    with pytest.raises(ValueError, match="pack_seconds 40 is over max_seconds 30"):
        SegmentationOptions(max_seconds=30, pack_seconds=40)


@pytest.fixture(scope="module")
def spoken():
    sentences = ["the weather is nice today", "please open the window", "we will meet again tomorrow morning"]
    clips = [espeak(s) for s in sentences]
    return recording(clips, [0.8, 1.2, 1.0, 0.9], noise=3e-3)


def test_speech_in_noise_is_cut_in_its_pauses_by_the_webrtc_vad(spoken):
    x, spans = spoken
    cut = segment(x, RATE, SegmentationOptions(max_seconds=20), WebRtcDetector(2))
    assert len(cut) == len(spans)
    for seg, (start, end) in zip(cut, spans):
        s, e = seg.seconds(RATE)
        assert s <= start + 0.05 and e >= end - 0.05  # no speech lost (within the VAD's onset)
        assert s >= start - 0.5 and e <= end + 0.5  # and the pauses left out


def test_webrtc_vad_reads_rates_it_has_no_mode_for(spoken):
    x, _ = spoken
    from attnserve.server.inputs.audio import resample

    at_44k = resample(x, RATE, 44100)
    a = segment(x, RATE, SegmentationOptions(max_seconds=20), WebRtcDetector(2))
    b = segment(at_44k, 44100, SegmentationOptions(max_seconds=20), WebRtcDetector(2))
    assert len(a) == len(b) and all(isinstance(s, Segment) for s in b)
    # The VAD reads 44.1 kHz resampled to 48 kHz: its decisions may move by a few frames.
    assert all(abs(s.start / RATE - t.start / 44100) <= 0.1 and abs(s.end / RATE - t.end / 44100) <= 0.1
               for s, t in zip(a, b))
