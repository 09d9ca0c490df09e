"""The CRC-32 of a file from its parts' CRC-32s is zlib's CRC-32 of the whole file."""

from __future__ import annotations

import random
import zlib

from statetier.backend.snapshot.crc import COMBINE_FROM, Crc32


def test_combined_crc_is_the_crc_of_the_whole() -> None:
    rnd = random.Random(11)
    for _ in range(50):
        parts = [
            rnd.randbytes(rnd.choice([0, 1, 7, 300, 70_000, COMBINE_FROM, 200_000]))
            for _ in range(rnd.randrange(6))
        ]
        crc = Crc32()
        for part in parts:
            crc.add(part, zlib.crc32(part) if rnd.random() < 0.7 else None)
        whole = b"".join(parts)
        assert (crc.value, crc.length) == (zlib.crc32(whole), len(whole))


def test_a_long_part_needs_no_pass_over_its_bytes() -> None:
    zeros = bytes(3 << 20)  # lengths with many bits set go through many table entries
    crc = Crc32()
    crc.add(b"head")
    crc.add(memoryview(zeros), zlib.crc32(zeros))
    assert crc.value == zlib.crc32(b"head" + zeros)
    wrong = Crc32()
    wrong.add(b"head")
    wrong.add(zeros, zlib.crc32(zeros) ^ 1)  # a long part's CRC-32 is taken as given
    assert wrong.value != crc.value


def test_a_short_part_is_read_even_when_its_crc_is_known() -> None:
    short = bytes(range(256)) * 40  # 10 KiB: reading it costs less than a combination
    crc = Crc32()
    crc.add(b"head")
    crc.add(short, zlib.crc32(short) ^ 1)  # not used: the bytes are read
    assert crc.value == zlib.crc32(b"head" + short)
