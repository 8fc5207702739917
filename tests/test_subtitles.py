"""clients/subtitles.py: cues cut where readers need them, written as SubRip and WebVTT."""

from __future__ import annotations

from attnserve.clients import subtitles
from attnserve.clients.subtitles import Cue, CueOptions
from attnserve.api.generation import FinishReason, GenerationResult, Timings, TranscriptSegment, WordTiming


def timed(text: str, start: float = 0.0, step: float = 0.3, gaps: dict[int, float] | None = None) -> list[WordTiming]:
    """Words of `text` `step` s apart (each lasting 0.25 s), with extra silence before the words in `gaps`."""
    out, t = [], start
    for i, word in enumerate(text.split()):
        t += (gaps or {}).get(i, 0.0)
        out.append(WordTiming(word, round(t, 3), round(t + 0.25, 3)))
        t += step
    return out


def test_a_pause_and_a_sentence_end_each_start_a_cue():
    words = timed("hello there. how are you doing today my friend", gaps={6: 1.0})
    cut = subtitles.cues(words)
    assert [c.lines for c in cut] == [("hello there.",), ("how are you doing",), ("today my friend",)]


def test_cues_hold_at_most_two_balanced_lines_of_42_characters_and_7_seconds():
    text = " ".join(["lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit"] * 6)
    cut = subtitles.cues(timed(text, step=0.35))
    assert len(cut) > 1
    for cue in cut:
        assert 1 <= len(cue.lines) <= 2 and all(len(line) <= 42 for line in cue.lines)
        assert cue.end_seconds - cue.start_seconds <= 7.0
    assert " ".join(" ".join(c.lines) for c in cut) == text  # every word once, in order
    two = [c for c in cut if len(c.lines) == 2]
    assert two and all(abs(len(c.lines[0]) - len(c.lines[1])) <= 12 for c in two)  # balanced, not greedy


def test_seven_seconds_end_a_cue_of_slow_short_words():
    cut = subtitles.cues(timed("a b c d e f g h i j k l m n o p", step=0.55))
    assert all(c.end_seconds - c.start_seconds <= 7.0 for c in cut) and len(cut) == 2


def test_segment_starts_start_cues_and_short_cues_are_held_until_the_next():
    first, second = timed("good morning", 1.0), timed("welcome back", 1.8)
    segments = [TranscriptSegment(0, 2, 0.8, 1.7, "good morning", first, FinishReason.EOS),
                TranscriptSegment(1, 2, 1.7, 2.5, "welcome back", second, FinishReason.EOS)]
    result = GenerationResult("m", "good morning welcome back", "en", [], [], FinishReason.EOS, None,
                              Timings(0, 0, 0, 0, 0, 1), first + second, segments=segments)
    cut = subtitles.result_cues(result)
    assert [c.lines for c in cut] == [("good morning",), ("welcome back",)]
    assert cut[0].end_seconds == 1.8  # held past its last word (1.55 s), up to the next cue
    assert cut[1].end_seconds == 2.8  # the last cue is held a whole second


def test_srt_and_vtt_are_written_as_their_specifications_say():
    cut = [Cue(1.5, 4.25, ("first line", "second line")), Cue(3661.002, 3662.0, ("later",))]
    assert subtitles.srt(cut) == ("1\n00:00:01,500 --> 00:00:04,250\nfirst line\nsecond line\n\n"
                                  "2\n01:01:01,002 --> 01:01:02,000\nlater\n")
    assert subtitles.vtt(cut) == ("WEBVTT\n\n00:00:01.500 --> 00:00:04.250\nfirst line\nsecond line\n\n"
                                  "01:01:01.002 --> 01:01:02.000\nlater\n")


def test_wrap_balances_two_lines_and_leaves_a_short_cue_on_one():
    assert subtitles.wrap(["short", "cue"]) == ("short cue",)
    words = "the quick brown fox jumps over the lazy dog and runs far away".split()
    top, bottom = subtitles.wrap(words, CueOptions(max_chars=42))
    assert (top, bottom) == ("the quick brown fox jumps over", "the lazy dog and runs far away")  # 30 + 30
