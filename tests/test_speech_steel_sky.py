"""Beneath a Steel Sky's reader: the RNC decompressor on streams packed here by a small encoder written for the
test, the disk index, the Huffman text and the tree search on files written here in the game's formats, and
the real packages where the machine has them (unpacked under $ATTNSERVE_REAL_SPEECH_PKG/<package>)."""

from __future__ import annotations

import random
import struct

import pytest

from attnserve.export.speech.real_sources import rnc, steel_sky
from real_packages import package_root


# --- a small RNC method-1 encoder -------------------------------------------------------------------------

class _Writer:
    """The stream as the decoder reads it: bits LSB-first in little-endian 16-bit words; a literal run's bytes
    go right after the word that is being filled."""

    def __init__(self):
        self.out = bytearray()
        self.slot, self.filled = None, 16

    def bits(self, value: int, n: int) -> None:
        for i in range(n):
            if self.filled == 16:
                self.slot, self.filled = len(self.out), 0
                self.out += b"\0\0"
            if value >> i & 1:
                word = struct.unpack_from("<H", self.out, self.slot)[0] | (1 << self.filled)
                struct.pack_into("<H", self.out, self.slot, word)
            self.filled += 1

    def raw(self, data: bytes) -> None:
        self.out += data


def _put_table(w: _Writer) -> None:
    """16 symbols of 4 bits each: symbol s gets code s (bit-reversed in the stream)."""
    w.bits(16, 5)
    for _ in range(16):
        w.bits(4, 4)


def _put_value(w: _Writer, value: int) -> None:
    symbol = value if value < 2 else value.bit_length()
    w.bits(int(f"{symbol:04b}"[::-1], 2), 4)
    if symbol >= 2:
        w.bits(value - (1 << (symbol - 1)), symbol - 1)


def _pack(steps: list[tuple[bytes, tuple[int, int] | None]]) -> tuple[bytes, bytes]:
    """An RNC method-1 stream of one block of (literal bytes, (distance, length) or None) steps, and what it
    unpacks to. Only the last step goes without a match."""
    w, out = _Writer(), bytearray()
    w.bits(0, 2)
    for _ in range(3):
        _put_table(w)
    w.bits(len(steps), 16)
    for literal, match in steps:
        _put_value(w, len(literal))
        if literal:
            w.raw(literal)
            out += literal
        if match:
            distance, length = match
            _put_value(w, distance - 1)
            _put_value(w, length - rnc.MIN_MATCH)
            for _ in range(length):
                out.append(out[-distance])
    packed = bytes(w.out)
    header = rnc.SIGNATURE + struct.pack(">IIHHBB", len(out), len(packed), rnc.crc16(bytes(out)), rnc.crc16(packed), 0, 1)
    return header + packed, bytes(out)


def test_rnc_unpacks_literals_and_overlapping_matches():
    rng = random.Random(0)
    steps = [(bytes(rng.randrange(256) for _ in range(n)), (d, l)) for n, d, l in
             [(5, 3, 7), (1, 1, 9), (0, 4, 2), (9, 12, 20), (2, 2, 3)]]
    steps.append((b"end", None))
    packed, expected = _pack(steps)
    assert rnc.unpack(packed, check_crc=True) == expected
    assert expected[5:12] == expected[2:5] + expected[2:5] + expected[2:3]  # an overlapping match repeats


def test_rnc_refuses_damaged_streams():
    packed, _ = _pack([(b"abcdef", (3, 4)), (b"xyz", None)])
    with pytest.raises(ValueError, match="signature"):
        rnc.unpack(b"RNC\x02" + packed[4:])
    with pytest.raises(ValueError, match="cut short"):
        rnc.unpack(packed[:-4])
    wrong_length = packed[:4] + struct.pack(">I", 99) + packed[8:]
    with pytest.raises(ValueError, match="header says 99"):
        rnc.unpack(wrong_length)
    bad_crc = packed[:12] + struct.pack(">H", rnc.crc16(b"other")) + packed[14:]
    with pytest.raises(ValueError, match="checksum"):
        rnc.unpack(bad_crc, check_crc=True)


def test_crc16_is_the_reflected_a001_checksum():
    assert rnc.crc16(b"123456789") == 0xBB3D  # CRC-16/ARC's check value


# --- the disk, the text and the tree ------------------------------------------------------------------------

def _disk(files: dict[int, tuple[bytes, int]]) -> steel_sky.Disk:
    """A sky.dnr/sky.dsk pair holding `files` (number -> (bytes as stored, flags above the size))."""
    dnr, dsk = bytearray(struct.pack("<I", len(files))), bytearray()
    for number, (data, flags) in files.items():
        while len(dsk) % 16:
            dsk += b"\0"
        offset = (len(dsk) >> 4) | 0x800000
        size = len(data) | flags
        dnr += struct.pack("<HHBHB", number, offset & 0xFFFF, offset >> 16, size & 0xFFFF, size >> 16)
        dsk += data
    return steel_sky.Disk(bytes(dnr), bytes(dsk))


def _header(flag: int) -> bytes:
    return struct.pack("<11H", flag, *([0] * 10))


def test_disk_reads_stored_and_packed_files():
    packed, plain = _pack([(b"speech!!", (8, 8)), (b"", None)])
    disk = _disk({50000: (_header(0) + b"\x80\x81\x7f", 0x800000),  # stored as is
                  50001: (_header(0x80) + packed, 0),  # packed after its header, which it keeps
                  50002: (_header(0x80) + packed, 0x400000)})  # packed, header left out
    assert disk.read(50000)[steel_sky.HEADER_BYTES:] == b"\x80\x81\x7f"
    assert disk.read(50001) == _header(0x80) + plain
    assert disk.read(50002) == plain
    assert 50001 in disk and 50003 not in disk
    with pytest.raises(KeyError):
        disk.read(50003)


def _codes(tree: list[tuple[int, int, int]], node: int = 0, path: str = "") -> dict[str, str]:
    left, right, value = tree[node]
    if not (left or right):
        return {chr(value): path}
    return _codes(tree, left, path + "0") | _codes(tree, right, path + "1")


# A small tree: 0 -> NUL, 10 -> "a", 110 -> " ", 111 -> "b".
TREE = [(1, 2, 0), (0, 0, 0), (3, 4, 0), (0, 0, ord("a")), (5, 6, 0), (0, 0, ord(" ")), (0, 0, ord("b"))]


def _section(lines: list[str], codes: dict[str, str]) -> bytes:
    """A text section file: offsets, one length byte per line (2-bit units), then the lines' bits."""
    bits, lengths = "", []
    for line in lines:
        code = "".join(codes[c] for c in line + "\0")
        code += "0" * (-len(code) % 2)  # lines start on 2-bit units
        lengths.append(len(code) // 2)
        bits += code
    blocks = (len(lines) + 31) // 32
    block_lengths = [sum(lengths[32 * b: 32 * b + 32]) for b in range(blocks)]
    length_bytes = bytes(n if n < 0x80 else 0x80 | (n >> 3) for n in lengths)
    assert all(n < 0x80 or n % 8 == 0 for n in lengths)
    lengths_at = 4 + 2 * blocks
    bits_at = lengths_at + 32 * blocks
    body = bytes(int((bits + "0" * (-len(bits) % 8))[i:i + 8], 2) for i in range(0, len(bits) + (-len(bits) % 8), 8))
    return struct.pack("<HH", lengths_at, bits_at) + struct.pack(f"<{blocks}H", *block_lengths) + \
        length_bytes.ljust(32 * blocks, b"\0") + body


def test_section_lines_decode_across_blocks():
    lines = [("ab " * (i % 5)).strip() or "a" for i in range(40)]  # two blocks of 32 lines
    assert steel_sky.section_lines(_section(lines, _codes(TREE)), TREE)[:40] == lines


def _tree(alphabet: str) -> list[tuple[int, int, int]]:
    """A tree with one leaf per character of `alphabet` (NUL first), made by splitting leaves in turn."""
    nodes, leaves = [(0, 0, 0)], [0]
    while len(leaves) < len(alphabet):
        leaf = leaves.pop(0)
        nodes[leaf] = (len(nodes), len(nodes) + 1, 0)
        nodes += [(0, 0, 0), (0, 0, 0)]
        leaves += [len(nodes) - 2, len(nodes) - 1]
    for leaf, char in zip(leaves, alphabet):
        nodes[leaf] = (0, 0, ord(char))
    return nodes


def test_huffman_trees_are_found_by_shape():
    big = _tree("\0" + "".join(chr(33 + i) for i in range(80)))  # 161 nodes
    flat = bytes(b for node in big for b in node)
    binary = b"\x07" * 37 + flat + b"\x01\x05\x00\x02\x09\x00" + b"\xff" * 20  # then a broken one
    found = steel_sky.huffman_trees(binary)
    assert found == [big]


def test_choose_tree_prefers_the_one_that_decodes_english():
    good = _tree("\0 theyouaisn")
    shuffled = _tree("\0 nsiauoyeht")  # same shape, letters swapped: printable gibberish
    section = _section(["the sun is in the tin", "you see", "it is the one"] * 4, _codes(good))
    disk = _disk({steel_sky.TEXT_FILE: (section, 0x800000)})
    assert steel_sky.choose_tree(disk, [shuffled, good]) is good
    with pytest.raises(ValueError, match="common-word share"):
        steel_sky.choose_tree(disk, [shuffled])


def test_clean_drops_backticks_and_keeps_capitals():
    assert steel_sky.clean("`Not ME.  I LIKE my job.") == "Not ME. I LIKE my job."


# --- the real packages ----------------------------------------------------------------------------------

GAME = package_root("beneath-a-steel-sky", steel_sky.FOLDER + "/sky.dnr")
SCUMMVM = package_root("scummvm", steel_sky.SCUMMVM_BINARY)


@pytest.mark.skipif(GAME is None or SCUMMVM is None, reason="Steel Sky and ScummVM packages not here")
def test_real_steel_sky_pairs_thousands_of_clips():
    clips = {c.key: c for c in steel_sky.clips(GAME, SCUMMVM)}
    assert len(clips) > 3000
    assert clips["1-0334"].text == "You're not going to WATCH, are you?"
    assert all(c.codec == "u8" and len(c.audio) > 2000 for c in clips.values())
