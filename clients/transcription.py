"""`attnserve transcribe`'s work beside the call: a long recording's progress bar, and its subtitle files.

A recording longer than the model's window is transcribed segment by segment on the server
(server/engine/longform.py); its stream sends each segment as soon as it is done, so the bar counts segments and
the audio they cover. Segments finish in any order (they decode together), so the bar counts, it does not
print text.
"""

from __future__ import annotations

import shutil
from typing import TextIO

from attnserve.clients import subtitles
from attnserve.api.generation import GenerationRequest, GenerationResult, TranscriptSegment


def transcribe(client, request: GenerationRequest, progress: TextIO | None = None) -> GenerationResult:
    """Streams `request` and returns its result, drawing a progress bar on `progress` (None = no bar).

    Raises:
        AttnServeError: the call failed. RuntimeError: the stream ended without a result.
    """
    bar = _Bar(progress)
    try:
        for event in client.stream(request):
            if isinstance(event, GenerationResult):
                return event
            if isinstance(event, TranscriptSegment):
                bar.add(event)
    finally:
        bar.close()
    raise RuntimeError("the stream ended without a final response")


def write_subtitles(result: GenerationResult, path: str, kind: str) -> None:
    """Writes the result's cues as `kind` ("srt" or "vtt") to `path`.

    Raises:
        SystemExit: the file cannot be written.
    """
    text = subtitles.render(subtitles.result_cues(result), kind)
    try:
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
    except OSError as exc:
        raise SystemExit(f"error: cannot write {path}: {exc.strerror}") from None


class _Bar:
    """`[#####-----] 12/40 segments, 3:20 of audio` redrawn in place on a terminal."""

    def __init__(self, out: TextIO | None):
        self._out, self._done, self._seconds, self._drawn = out, 0, 0.0, False

    def add(self, segment: TranscriptSegment) -> None:
        self._done += 1
        self._seconds += segment.end_seconds - segment.start_seconds
        if self._out is None:
            return
        width = max(10, min(40, shutil.get_terminal_size((80, 24)).columns - 40))
        filled = round(width * self._done / max(segment.count, 1))
        minutes, seconds = divmod(round(self._seconds), 60)
        self._out.write(f"\r[{'#' * filled}{'-' * (width - filled)}] {self._done}/{segment.count} segments, "
                        f"{minutes}:{seconds:02d} of speech")
        self._out.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self._out.write("\n")
            self._out.flush()
