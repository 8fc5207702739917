"""Map a synthesizer's own timed items onto the transcript's words.

Engines time *their* words, which are not always the transcript's: espeak-ng merges
function words into one phonetic word ("in the"), flite drops apostrophes ("dont"),
Piper only times phoneme groups. Three matchers cover them:

* ``by_position``: items carry the character offset where they start in the spoken text
  (espeak-ng word events); each transcript word belongs to the last item starting at or
  before it.
* ``by_name``: items carry a word name (flite, festival); names are matched with a
  sequence alignment, unmatched transcript words are estimated between their neighbours.
* ``by_counts``: items carry a phoneme count (Piper); a dynamic programme cuts the
  transcript into contiguous runs whose phoneme counts best match each item.

When one item covers several transcript words, its interval is divided in proportion to
the words' weights (letters or phonemes). Every matcher returns one ``(start, end)`` in
seconds per transcript word plus the number of words that were split or estimated, so a
manifest can say how exact its times are.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

_LETTERS = re.compile(r"[^a-z]")


@dataclass(frozen=True)
class TimedItem:
    """One word (or word group) as an engine timed it."""

    start: float  # seconds from the start of the audio
    end: float  # seconds; >= start
    position: int | None = None  # character offset of its first letter in the spoken text
    name: str | None = None  # the engine's spelling of the word
    count: int | None = None  # phonemes in the item (Piper)


Times = list[tuple[float, float]]


def monotonic(times: Times) -> Times:
    """Clip each word to start no earlier than the previous word ends, and end no earlier
    than it starts (engines occasionally report a zero end for a spelled-out item)."""
    out: Times = []
    previous_end = 0.0
    for start, end in times:
        start = max(start, previous_end)
        end = max(end, start)
        out.append((start, end))
        previous_end = end
    return out


def split_interval(start: float, end: float, weights: list[float]) -> Times:
    """Divide ``[start, end]`` into consecutive pieces proportional to ``weights``."""
    weights = [w if w > 0 else 1.0 for w in weights]
    total = sum(weights)
    out, t = [], start
    for i, w in enumerate(weights):
        nxt = end if i == len(weights) - 1 else t + (end - start) * w / total
        out.append((t, nxt))
        t = nxt
    return out


def _letters(word: str) -> int:
    return max(1, len(_LETTERS.sub("", word.lower())))


def by_position(words: list[str], offsets: list[int], items: list[TimedItem]) -> tuple[Times, int]:
    """Times for ``words`` (starting at character ``offsets``) from position-tagged ``items``.

    Returns:
        One (start, end) per word, and how many words shared an item with another word.

    Raises:
        ValueError: if there are words but no items.
    """
    if not items:
        if words:
            raise ValueError("the engine reported no word items")
        return [], 0
    items = sorted(items, key=lambda it: it.position)
    groups: list[list[int]] = [[] for _ in items]
    k = 0
    for j, offset in enumerate(offsets):
        while k + 1 < len(items) and items[k + 1].position <= offset:
            k += 1
        groups[k].append(j)
    times: Times = [(0.0, 0.0)] * len(words)
    shared = 0
    for item, group in zip(items, groups):
        if len(group) > 1:
            shared += len(group)
        pieces = split_interval(item.start, item.end, [_letters(words[j]) for j in group])
        for j, piece in zip(group, pieces):
            times[j] = piece
    return monotonic(times), shared


def by_name(words: list[str], items: list[TimedItem]) -> tuple[Times, int]:
    """Times for ``words`` from name-tagged ``items``, matched by a sequence alignment.

    Returns:
        One (start, end) per word, and how many words were split from a shared item or
        estimated between neighbours (no matching item).
    """
    keys = [_LETTERS.sub("", w.lower()) for w in words]
    names = [_LETTERS.sub("", (it.name or "").lower()) for it in items]
    times: list[tuple[float, float] | None] = [None] * len(words)
    inexact = 0
    matcher = difflib.SequenceMatcher(a=names, b=keys, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            for i, j in zip(range(i1, i2), range(j1, j2)):
                times[j] = (items[i].start, items[i].end)
        elif op == "replace":
            # k engine words spoke these m transcript words: share their span by letters.
            pieces = split_interval(items[i1].start, items[i2 - 1].end, [_letters(w) for w in words[j1:j2]])
            times[j1:j2] = pieces
            inexact += j2 - j1
    # Words the engine never named: a zero-length estimate at the neighbouring boundary.
    for j, t in enumerate(times):
        if t is None:
            before = next((times[i][1] for i in range(j - 1, -1, -1) if times[i] is not None), None)
            after = next((times[i][0] for i in range(j + 1, len(times)) if times[i] is not None), None)
            at = before if before is not None else (after if after is not None else 0.0)
            times[j] = (at, after if after is not None and after >= at else at)
            inexact += 1
    return monotonic([t for t in times if t is not None]), inexact


def by_counts(word_counts: list[int], items: list[TimedItem]) -> tuple[Times, int]:
    """Times for words with phoneme counts ``word_counts`` from count-tagged ``items``.

    Each item takes a contiguous, non-empty run of words; the runs minimise the total
    absolute difference between an item's count and its words' summed counts.

    Returns:
        One (start, end) per word, and how many words shared an item with another word.

    Raises:
        ValueError: if there are fewer words than items (no partition exists).
    """
    n, m = len(word_counts), len(items)
    if m > n or (m == 0 and n):
        raise ValueError(f"cannot cut {n} words into {m} timed groups")
    inf = float("inf")
    # cost[i][j]: best cost of the first i items covering the first j words.
    cost = [[inf] * (n + 1) for _ in range(m + 1)]
    back = [[0] * (n + 1) for _ in range(m + 1)]
    cost[0][0] = 0.0
    prefix = [0]
    for c in word_counts:
        prefix.append(prefix[-1] + c)
    for i in range(1, m + 1):
        for j in range(i, n - (m - i) + 1):
            for k in range(i - 1, j):
                c = cost[i - 1][k] + abs((items[i - 1].count or 0) - (prefix[j] - prefix[k]))
                if c < cost[i][j]:
                    cost[i][j], back[i][j] = c, k
    times: Times = [(0.0, 0.0)] * n
    shared, j = 0, n
    for i in range(m, 0, -1):
        k = back[i][j]
        if j - k > 1:
            shared += j - k
        pieces = split_interval(items[i - 1].start, items[i - 1].end, [float(c) for c in word_counts[k:j]])
        times[k:j] = pieces
        j = k
    return monotonic(times), shared
