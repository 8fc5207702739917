"""Beneath a Steel Sky, CD version v0.0372 (Debian `beneath-a-steel-sky`): voice clips and their lines.

Formats learnt from ScummVM's engines/sky (disk.cpp, text.cpp, sound.cpp); the code is ours.

- `sky.dnr` indexes `sky.dsk`: a little-endian u32 count, then 8 bytes per file: u16 number, 24-bit offset
  (bit 23: multiply the rest by 16), 24-bit size and flags (bit 23: stored as is; bit 22: the packed stream
  leaves out the 22-byte header). A stored-packed file starts with that header, whose u16 flag has bit 7
  set, and its packed bytes are an RNC method-1 stream (rnc.py).
- Text: file 60600 + section (English) for sections 0-7. u16 at 0: where the per-line lengths start; u16 at 2:
  where the bits start; from 4: one u16 per block of 32 lines, that block's length. Lengths are counted in
  2-bit units; a line-length byte with bit 7 set counts (byte & 0x7F) * 8. Each line is Huffman-coded, read
  from each byte's top bit down, and ends at a NUL.
- Speech: line n of section s is file 50000 + FIRST_SPEECH_FILE[s] + n: the 22-byte header, then raw
  unsigned 8-bit mono PCM at 11,025 Hz.
- The Huffman tree is not in the package: it lived in the game's executable. ScummVM's binary (Debian
  `scummvm`) holds every version's tree as an array of (left, right, value) byte triples; `huffman_trees`
  finds them there by their shape, and `clips` keeps the one that decodes this version's text as text.
"""

from __future__ import annotations

import pathlib
import re
import struct
from typing import Iterator

from attnserve.export.speech.real_sources import Clip, rnc

SOURCE = "beneath-a-steel-sky"
FOLDER = "usr/share/scummvm/beneath-a-steel-sky"
SCUMMVM_BINARY = "usr/games/scummvm"
SAMPLE_RATE = 11025
HEADER_BYTES = 22
TEXT_FILE = 60600
SPEECH_FILE = 50000
# The first speech file of each text section (the game's own table, the same in every version).
FIRST_SPEECH_FILE = (0, 600, 1100, 2430, 3380, 4530, 5080, 5230)
Tree = list[tuple[int, int, int]]


class Disk:
    """The files of `sky.dsk` as `sky.dnr` indexes them."""

    def __init__(self, dnr: bytes, dsk: bytes):
        (count,) = struct.unpack_from("<I", dnr, 0)
        if len(dnr) < 4 + 8 * count:
            raise ValueError(f"sky.dnr names {count} files but holds {(len(dnr) - 4) // 8}")
        self.dsk = dsk
        self.entries: dict[int, tuple[int, int]] = {}
        for i in range(count):
            number, offset_lo, offset_hi, flags_lo, flags_hi = struct.unpack_from("<HHBHB", dnr, 4 + 8 * i)
            offset = offset_lo | (offset_hi << 16)
            flags = flags_lo | (flags_hi << 16)
            self.entries[number] = (offset, flags)

    def __contains__(self, number: int) -> bool:
        return number in self.entries

    def read(self, number: int) -> bytes:
        """File `number`, unpacked (header included).

        Raises:
            KeyError: if the index has no such file. ValueError: if its packed stream is damaged.
        """
        offset, flags = self.entries[number]
        if offset & 0x800000:
            offset = (offset & 0x7FFFFF) << 4
        data = self.dsk[offset:offset + (flags & 0x3FFFFF)]
        stored = flags & 0x800000
        if stored or len(data) < HEADER_BYTES or not (data[0] & 0x80) or data[HEADER_BYTES:HEADER_BYTES + 4] != rnc.SIGNATURE:
            return data
        unpacked = rnc.unpack(data[HEADER_BYTES:])
        return unpacked if flags & 0x400000 else data[:HEADER_BYTES] + unpacked


def huffman_trees(binary: bytes) -> list[Tree]:
    """Every array of (left, right, value) byte triples in `binary` that forms a whole binary tree with its
    root first, children after their parents and values only at the leaves (at least 64 nodes)."""
    trees = []
    for match in re.finditer(rb"\x01[\x02-\xff]\x00", binary):  # the root: left child 1, no value
        tree = _tree_at(binary, match.start())
        if tree:
            trees.append(tree)
    return trees


def _tree_at(binary: bytes, at: int) -> Tree | None:
    seen, stack = set(), [0]
    while stack:
        node = stack.pop()
        if node in seen or at + 3 * node + 3 > len(binary) or len(seen) > 512:
            return None
        seen.add(node)
        left, right, value = binary[at + 3 * node: at + 3 * node + 3]
        if left or right:
            if value or left <= node or right <= node:
                return None
            stack += [left, right]
    size = max(seen) + 1
    if len(seen) != size or size < 64:
        return None
    return [tuple(binary[at + 3 * i: at + 3 * i + 3]) for i in range(size)]


def section_lines(data: bytes, tree: Tree) -> list[str]:
    """The lines of one text section file, decoded with `tree`, up to the first one that does not decode."""
    lengths_at, bits_at = struct.unpack_from("<HH", data, 0)
    blocks = (lengths_at - 4) // 2
    lines, block_start = [], 0
    for block, block_length in enumerate(struct.unpack_from(f"<{blocks}H", data, 4)):
        offset = block_start
        for length_byte in data[lengths_at + 32 * block: lengths_at + 32 * block + 32]:
            line = _decode(data, tree, bits_at * 8 + offset * 2)
            if line is None:
                return lines
            lines.append(line)
            offset += _skip(length_byte)
        block_start += block_length
    return lines


def _skip(byte: int) -> int:
    return (byte & 0x7F) << 3 if byte & 0x80 else byte


def _decode(data: bytes, tree: Tree, bit: int, max_chars: int = 1000) -> str | None:
    chars = []
    while len(chars) < max_chars:
        node = 0
        while True:
            if bit >> 3 >= len(data):
                return None
            node = tree[node][1] if data[bit >> 3] >> (7 - (bit & 7)) & 1 else tree[node][0]
            bit += 1
            left, right, value = tree[node]
            if not (left or right):
                break
        if value == 0:
            return "".join(chars)
        chars.append(chr(value))
    return None


COMMON_WORDS = frozenset("the you i a to it is and of that what in me my this for have be not on your do".split())


def _common_words(lines: list[str]) -> float:
    """Share of words that are English's commonest (a quarter of English text; a wrong tree's
    printable gibberish has few)."""
    words = " ".join(lines).lower().split()
    return sum(w.strip(".,!?") in COMMON_WORDS for w in words) / len(words) if words else 0.0


def _printable(lines: list[str]) -> float:
    """Share of characters that are printable ASCII: a wrong tree soon decodes bytes above 0x7E or controls."""
    text = "".join(lines)
    return sum(" " <= c <= "~" for c in text) / len(text) if text else 0.0


def choose_tree(disk: Disk, trees: list[Tree]) -> Tree:
    """The tree that decodes the first text section as English (most common words), then as the most
    printable text (the first of equals: the trees of neighbouring versions differ only in symbols that
    this text hardly uses).

    Raises:
        ValueError: if none decodes it as English.
    """
    sample = disk.read(TEXT_FILE)
    scored = []
    for i, tree in enumerate(trees):
        lines = section_lines(sample, tree)
        scored.append((round(_common_words(lines), 2), _printable(lines), -i))
    common, _, index = max(scored, default=(0.0, 0.0, 1))
    if common < 0.1:
        raise ValueError(f"no Huffman tree decodes Steel Sky's text as English (best common-word share {common:.2f})")
    return trees[-index]


def clean(line: str) -> str:
    """The line without the game's stray backticks and with its whitespace collapsed; the emphasis that the
    game writes in capitals is left to the normaliser (which lower-cases)."""
    return " ".join(line.replace("`", "").split())


def clips(root: pathlib.Path, scummvm_root: pathlib.Path) -> Iterator[Clip]:
    """Every line that has a voice clip, from the unpacked game package and ScummVM package."""
    folder = root / FOLDER
    disk = Disk((folder / "sky.dnr").read_bytes(), (folder / "sky.dsk").read_bytes())
    tree = choose_tree(disk, huffman_trees((scummvm_root / SCUMMVM_BINARY).read_bytes()))
    for section, first in enumerate(FIRST_SPEECH_FILE):
        if TEXT_FILE + section not in disk:
            continue
        for number, line in enumerate(section_lines(disk.read(TEXT_FILE + section), tree)):
            speech = SPEECH_FILE + first + number
            if speech not in disk or not line.strip():
                continue
            audio = disk.read(speech)[HEADER_BYTES:]
            if audio:
                yield Clip(SOURCE, f"{section}-{number:04d}", clean(line), "", audio, "u8", SAMPLE_RATE)
