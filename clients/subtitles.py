"""Subtitles from a transcript's timed words: SubRip (.srt) and WebVTT (.vtt).

Words are taken in order into a cue until the next one would break a rule of readable captions (the BBC
and Netflix style guides agree on these): a cue shows at most `max_lines` lines of at most `max_chars`
characters, lasts at most `max_seconds`, and ends where the speaker pauses (`pause_seconds`), where a
sentence ends (a word ending in . ? !), and where the server cut the recording into segments (it cut at a
pause). A cue's lines are balanced: the break falls where the longer line is shortest. A cue shorter than
`min_seconds` is held longer, up to the next cue's start, so that it can be read.

Only plain data goes in (the server's WordTiming and TranscriptSegment dataclasses); nothing here calls the
server, so the rules are tested alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from attnserve.api.generation import GenerationResult, WordTiming

_SENTENCE_ENDS = (".", "?", "!", "…")


@dataclasses.dataclass(frozen=True)
class CueOptions:
    """What one cue may hold."""

    max_chars: int = 42  # characters per line
    max_lines: int = 2
    max_seconds: float = 7.0  # longest cue
    pause_seconds: float = 0.6  # a silence at least this long between two words ends a cue
    min_seconds: float = 1.0  # shorter cues are held up to this long when the next cue starts later


@dataclasses.dataclass(frozen=True)
class Cue:
    start_seconds: float
    end_seconds: float
    lines: tuple[str, ...]


def cues(words: Sequence[WordTiming], breaks: Iterable[int] = (), options: CueOptions = CueOptions()) -> list[Cue]:
    """The cues of a transcript.

    Args:
        words: timed words in order, times from the start of the recording.
        breaks: indices of words that must start a cue (the first words of the server's segments).
    """
    starts = set(breaks)
    groups: list[list[WordTiming]] = []
    for i, word in enumerate(words):
        if not groups or i in starts or not _fits(groups[-1], word, options):
            groups.append([word])
        else:
            groups[-1].append(word)
    out = [Cue(g[0].start_seconds, g[-1].end_seconds, wrap([w.word for w in g], options)) for g in groups]
    return _held(out, options.min_seconds)


def result_cues(result: GenerationResult, options: CueOptions = CueOptions()) -> list[Cue]:
    """The cues of a transcription result: its words, broken at its segments' starts where it has segments."""
    breaks, count = [], 0
    for segment in result.segments:
        breaks.append(count)
        count += len(segment.words)
    return cues(result.words, breaks, options)


def _fits(group: list[WordTiming], word: WordTiming, o: CueOptions) -> bool:
    """Whether `word` may join the cue of `group`."""
    last = group[-1]
    if last.word.endswith(_SENTENCE_ENDS) or word.start_seconds - last.end_seconds >= o.pause_seconds:
        return False
    if word.end_seconds - group[0].start_seconds > o.max_seconds:
        return False
    return len(_greedy_lines([w.word for w in group] + [word.word], o.max_chars)) <= o.max_lines


def _greedy_lines(words: Sequence[str], width: int) -> list[str]:
    """Words filled into lines of at most `width` characters (a longer word gets a line of its own)."""
    lines: list[str] = []
    for word in words:
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def wrap(words: Sequence[str], options: CueOptions = CueOptions()) -> tuple[str, ...]:
    """A cue's words as lines: one line when they fit, else two balanced ones (the longer line as short as it
    can be), else greedy lines."""
    text = " ".join(words)
    if len(text) <= options.max_chars or len(words) < 2:
        return (text,)
    if len(_greedy_lines(words, options.max_chars)) <= 2:
        k = min(range(1, len(words)), key=lambda k: max(len(" ".join(words[:k])), len(" ".join(words[k:]))))
        return " ".join(words[:k]), " ".join(words[k:])
    return tuple(_greedy_lines(words, options.max_chars))


def _held(out: list[Cue], least: float) -> list[Cue]:
    """Cues shorter than `least` seconds lengthened, never into the next cue."""
    held = []
    for i, cue in enumerate(out):
        limit = out[i + 1].start_seconds if i + 1 < len(out) else cue.start_seconds + least
        end = max(cue.end_seconds, min(cue.start_seconds + least, limit))
        held.append(dataclasses.replace(cue, end_seconds=end))
    return held


def srt(cue_list: Sequence[Cue]) -> str:
    """SubRip: numbered cues, times as HH:MM:SS,mmm."""
    blocks = [f"{i}\n{_time(c.start_seconds, ',')} --> {_time(c.end_seconds, ',')}\n" + "\n".join(c.lines) + "\n"
              for i, c in enumerate(cue_list, 1)]
    return "\n".join(blocks)


def vtt(cue_list: Sequence[Cue]) -> str:
    """WebVTT: the header, then cues with times as HH:MM:SS.mmm."""
    blocks = [f"{_time(c.start_seconds, '.')} --> {_time(c.end_seconds, '.')}\n" + "\n".join(c.lines) + "\n"
              for c in cue_list]
    return "\n".join(["WEBVTT\n", *blocks])


def render(cue_list: Sequence[Cue], kind: str) -> str:
    """`srt` or `vtt` text of the cues."""
    if kind not in ("srt", "vtt"):
        raise ValueError(f"unknown subtitle format {kind!r}: use srt or vtt")
    return srt(cue_list) if kind == "srt" else vtt(cue_list)


def _time(seconds: float, separator: str) -> str:
    ms = max(0, round(seconds * 1000))
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{separator}{ms:03d}"
