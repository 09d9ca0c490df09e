"""The CRC-32 of a file from the CRC-32s of its parts, without reading the bytes again.

A compacted base is laid out part by part, and each block's CRC-32 is known (computed once for
the block's index entry, or copied from the old base's index for a block taken as-is); the
whole-file CRC-32 the manifest records would be a second pass over every byte. CRC-32 is linear
over GF(2), so ``crc(a + b)`` follows from ``crc(a)``, ``crc(b)`` and ``len(b)``: ``crc(a)``
times x to the power of ``8 * len(b)`` (mod the CRC polynomial), plus ``crc(b)``. The power is
built from a table of x^(2^k), so a combination costs a few hundred integer steps whatever the
length. The same algorithm zlib implements as ``crc32_combine``, which Python's zlib module does
not expose.

Those steps run in Python: about 55 us, the time zlib takes to read 120 KiB. A part shorter than
``COMBINE_FROM`` is therefore read again even when its CRC-32 is known (a state host's delta
blocks are a few KiB to a few tens of KiB each; a combination for each was 3% of its snapshot).
"""

from __future__ import annotations

import zlib

__all__ = ["COMBINE_FROM", "Crc32"]

COMBINE_FROM = 128 * 1024  # bytes: from this length a combination costs less than a read

_POLY = 0xEDB88320  # CRC-32 (IEEE), bit-reflected as zlib computes it
_ONE = 1 << 31  # the polynomial 1 in the reflected representation


def _multiply(a: int, b: int) -> int:
    """a times b modulo the CRC polynomial (both reflected)."""
    product = 0
    bit = _ONE
    while a:
        if a & bit:
            product ^= b
            a ^= bit
        bit >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return product


def _powers() -> list[int]:
    """x^(2^k) modulo the polynomial, for k = 0..31; they repeat with period 32 (the order of x
    divides 2^32 - 1), so k is taken modulo 32."""
    table = [_ONE >> 1]  # x^1
    for _ in range(31):
        table.append(_multiply(table[-1], table[-1]))
    return table


_X2N = _powers()


def _shift(crc: int, length: int) -> int:
    """``crc`` times x^(8 * length): the CRC-32 of some bytes followed by ``length`` zeros,
    less the CRC-32 of those zeros alone."""
    factor = _ONE
    k = 3  # 8 = 2^3 bits per byte
    while length:
        if length & 1:
            factor = _multiply(_X2N[k & 31], factor)
        length >>= 1
        k += 1
    return _multiply(factor, crc)


class Crc32:
    """The running CRC-32 of a file put together from parts."""

    def __init__(self) -> None:
        self.value = 0
        self.length = 0

    def add(self, part: bytes | memoryview, crc32: int | None = None) -> None:
        """Append ``part``; ``crc32`` is its CRC-32 when already known (then the bytes of a
        part of at least ``COMBINE_FROM`` bytes are not read)."""
        if crc32 is None or len(part) < COMBINE_FROM:
            self.value = zlib.crc32(part, self.value)
        else:
            self.value = _shift(self.value, len(part)) ^ crc32
        self.length += len(part)
