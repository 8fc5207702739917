"""Rob Northen's "RNC" method-1 decompressor, which Beneath a Steel Sky packs its files with.

Format (learnt from ScummVM's engines/sky/rnc_deco.cpp and the format's public descriptions): an 18-byte
header ("RNC\\x01", big-endian unpacked and packed lengths, CRC-16s of both, a leeway byte, a block count),
then a stream read as little-endian 16-bit words, least significant bit first, that starts with two flag
bits. Each block holds three canonical Huffman tables (literal-run lengths, match offsets, match lengths:
5 bits of count, 4 bits of code length each), a 16-bit count of steps and, per step, a literal run whose
bytes lie in the stream itself (at the word after the one being read) and, except in the last step, a
match. A table's symbol s >= 2 stands for 2^(s-1) plus s-1 further bits.
"""

from __future__ import annotations

import struct

SIGNATURE = b"RNC\x01"
HEADER_BYTES = 18
MIN_MATCH = 2


class _Bits:
    """The stream's bit reader: `buffer` holds `count` >= 16 bits, whose top 16 are the word at `at`."""

    def __init__(self, data: bytes, at: int):
        self.data, self.at = data, at
        self.buffer, self.count = self._word(at), 16

    def _word(self, at: int) -> int:
        return self.data[at] | (self.data[at + 1] << 8) if at + 1 < len(self.data) else (
            self.data[at] if at < len(self.data) else 0)

    def peek16(self) -> int:
        return self.buffer & 0xFFFF

    def read(self, n: int) -> int:
        value = self.buffer & ((1 << n) - 1)
        self.buffer >>= n
        self.count -= n
        if self.count < 16:
            self.at += 2
            self.buffer |= self._word(self.at) << self.count
            self.count += 16
        return value

    def take_bytes(self, n: int) -> bytes:
        """n literal bytes from the stream (from the word the buffer read ahead), then the buffer refilled."""
        chunk = self.data[self.at:self.at + n]
        if len(chunk) != n:
            raise ValueError("RNC stream ends inside a literal run")
        self.at += n
        self.count -= 16
        self.buffer = (self.buffer & ((1 << self.count) - 1)) | (self._word(self.at) << self.count)
        self.count += 16
        return chunk


def _reverse(code: int, length: int) -> int:
    return int(f"{code:0{length}b}"[::-1], 2)


def _table(bits: _Bits) -> tuple[dict[tuple[int, int], int], list[int]]:
    """A canonical Huffman table: (code length, bit-reversed code) -> symbol, and its code lengths in order."""
    symbols = bits.read(5)
    lengths = [bits.read(4) for _ in range(symbols)]
    table, code = {}, 0
    for length in range(1, 17):
        for symbol, symbol_length in enumerate(lengths):
            if symbol_length == length:
                table[(length, _reverse(code >> (16 - length), length))] = symbol
                code += 1 << (16 - length)
    return table, sorted({length for length, _ in table})


def _value(bits: _Bits, table: dict[tuple[int, int], int], lengths: list[int]) -> int:
    word = bits.peek16()
    for length in lengths:
        symbol = table.get((length, word & ((1 << length) - 1)))
        if symbol is not None:
            bits.read(length)
            if symbol < 2:
                return symbol
            return (1 << (symbol - 1)) | bits.read(symbol - 1)
    raise ValueError("RNC stream has a code its table does not hold")


def crc16(data: bytes) -> int:
    """CRC-16 with the reflected polynomial 0xA001 and initial value 0 (the header's checksums)."""
    crc = 0
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0xA001 if crc & 1 else crc >> 1
    return crc


def unpack(data: bytes, check_crc: bool = False) -> bytes:
    """The unpacked bytes of an RNC method-1 stream that starts at data[0].

    Raises:
        ValueError: if it is not one, or it is damaged (lengths, codes, or with check_crc the checksum).
    """
    if data[:4] != SIGNATURE:
        raise ValueError("not an RNC method-1 stream (no 'RNC\\x01' signature)")
    unpacked_length, packed_length, unpacked_crc, _packed_crc, _leeway, blocks = struct.unpack_from(
        ">IIHHBB", data, 4)
    if HEADER_BYTES + packed_length > len(data):
        raise ValueError(f"RNC stream is cut short: {len(data) - HEADER_BYTES} of {packed_length} packed bytes")
    bits = _Bits(data[:HEADER_BYTES + packed_length] + b"\0\0\0\0", HEADER_BYTES)
    bits.read(2)  # the lock and key flags
    out = bytearray()
    for _ in range(blocks):
        (raw, raw_lengths), (offsets, offset_lengths), (matches, match_lengths) = (_table(bits) for _ in range(3))
        steps = bits.read(16)
        for step in range(steps):
            run = _value(bits, raw, raw_lengths)
            if run:
                out += bits.take_bytes(run)
            if step < steps - 1:
                distance = _value(bits, offsets, offset_lengths) + 1
                length = _value(bits, matches, match_lengths) + MIN_MATCH
                if distance > len(out):
                    raise ValueError("RNC match reaches before the start of the output")
                start = len(out) - distance
                if distance >= length:
                    out += out[start:start + length]
                else:
                    for i in range(length):
                        out.append(out[start + i])
    if len(out) != unpacked_length:
        raise ValueError(f"RNC stream unpacked to {len(out)} bytes, its header says {unpacked_length}")
    if check_crc and crc16(out) != unpacked_crc:
        raise ValueError("RNC stream's unpacked checksum does not match")
    return bytes(out)
