"""Compressed blocks (``checkpoint.compression``): a chain may mix files written with and
without compression (the setting changed between runs) and still restores and compacts exactly;
a damaged compressed block is reported with its file and key group; a file with a codec this
reader lacks is refused by name; ``none`` writes the format from before compression.
"""

from __future__ import annotations

import struct
import sys
import zlib
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zstandard
from statetier.backend.config import ConfigError, load_config
from statetier.backend.local_runner import LocalRunner
from statetier.backend.snapshot.compaction import LocalCompactor, make_request
from statetier.backend.snapshot.format import (
    BASE,
    COLUMNS_FORMAT_VERSION,
    COMPRESSED_FORMAT_VERSION,
    FORMAT_VERSION,
    CorruptFileError,
    DataFileBuilder,
    DataFileReader,
    encode_data_file,
)

sys.path.insert(0, str(Path(__file__).parents[2]))  # the repository: tests.compaction.*

from tests.compaction.compaction_support import MAX_P, SumAndLast, dump, records

HEADER = {"state": "s", "key_groups": "0-3", "epoch": 1, "kind": BASE}


def _runner(uri: str, codec: str) -> LocalRunner:
    # merges held off: the test asks for the one it looks at
    config = load_config(
        {
            "checkpoint.compression": codec,
            "compaction.delta-trigger": 1000,
            "compaction.size-ratio": 1e6,
        },
        env={},
    )
    return LocalRunner(SumAndLast, 1, max_parallelism=MAX_P, checkpoint_uri=uri, config=config)


def _codecs(runner: LocalRunner) -> list[tuple[str, str, int]]:
    """(kind, codec, format version) of every keyed file of the runner's last manifest."""
    assert runner.store is not None
    found = []
    for entry in runner.store.manifest().keyed_files:
        reader = DataFileReader(runner.store.read(entry), entry.path)
        found.append((entry.kind or BASE, reader.codec, reader.version))
    return found


def test_a_chain_that_changes_codec_restores_and_compacts_exactly(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/ckpt"
    # the deltas touch few key groups: a merge copies the base's other blocks
    plain = _runner(uri, "none")
    plain.process(records(3, 1))
    plain.checkpoint()
    plain.process([("k2", 4), ("k3", 0)])  # 0 clears k3: a tombstone
    plain.checkpoint()
    assert {(c, v) for _, c, v in _codecs(plain)} == {("none", COLUMNS_FORMAT_VERSION)}
    plain.close()

    compressed = _runner(uri, "zstd")  # restores the plain chain, then adds compressed deltas
    compressed.process([("k1", 5), ("k2", 6)])
    compressed.checkpoint()
    expected = dump(compressed)
    kinds = _codecs(compressed)
    assert ("delta", "zstd", COLUMNS_FORMAT_VERSION) in kinds
    assert ("base", "none", COLUMNS_FORMAT_VERSION) in kinds
    store = compressed.store
    assert store is not None
    manifest = store.manifest()
    compressed.close()

    reread = _runner(uri, "none")  # every file read back whatever the setting says
    assert dump(reread) == expected
    reread.close()

    for chain in manifest.chains():
        request = make_request(store.url, chain.state, chain.files, "data/c", MAX_P)
        (output,) = LocalCompactor().compact(request).outputs
        data = Path(output.url.removeprefix("file://")).read_bytes()
        base = DataFileReader(data, output.url)
        assert base.codec == "zstd"  # as the newest input, the untouched plain blocks too
        state: dict[bytes, bytes | None] = {}
        for key_group in base.index:
            state.update(base.read_block(key_group))
        named = expected.get(chain.state, {})
        assert len(state) == len(named) and base.verify() == len(named)
        assert len(base.index) > 2  # untouched blocks, taken from the plain base


def _file_with_block(block: bytes, layout: str, codec: str = "zstd") -> bytes:
    builder = DataFileBuilder({**HEADER, "codec": codec, "layout": layout})
    parts = [builder.head, builder.add_raw(2, block, zlib.crc32(block), 1), builder.tail()]
    return b"".join(bytes(p) for p in parts)


def _zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


_ONE = struct.pack("<IBBB", 1, 1, 1, 0) + b"\x01\x02kvv"  # a good columns block: k -> vv


@pytest.mark.parametrize(
    ("layout", "block", "problem"),
    [
        ("msgpack", b"\x28\xb5\x2f\xfd not a frame", "unreadable: zstd"),  # zstd's magic only
        ("columns", b"\x28\xb5\x2f\xfd not a frame", "unreadable: zstd"),
        ("msgpack", _zstd(b"\xc1"), "unreadable"),  # bytes msgpack never uses
        (
            "msgpack",
            _zstd(msgpack.packb([b"k", b"v", b"k2", b"v2"])),
            "holds 2 entries, index says 1",
        ),
        ("columns", _zstd(_ONE[:3]), "shorter than a block's head"),
        ("columns", _zstd(struct.pack("<IBBB", 3, 1, 1, 0) + b"\x01\x01kv"), "too short"),
        ("columns", _zstd(_ONE[:-1]), "add up to 12 bytes, not its 11"),  # a byte lost
        ("columns", _zstd(_ONE + b"x"), "add up to 12 bytes, not its 13"),
        ("columns", _zstd(_ONE[:4] + b"\x03" + _ONE[5:]), "unknown length width"),
        ("columns", _zstd(_ONE[:6] + b"\x02" + _ONE[7:]), "unknown length width or flag"),
        (  # two entries of which one is the index's
            "columns",
            _zstd(struct.pack("<IBBB", 2, 1, 1, 0) + b"\x01\x01\x01\x01abxy"),
            "holds 2 entries, index says 1",
        ),
        (  # a tombstone, in a base
            "columns",
            _zstd(struct.pack("<IBBB", 1, 1, 1, 1) + b"\x01\x00\x01k"),
            "holds a tombstone, but this is not a delta file",
        ),
        (  # a tombstone column that is not 0s and 1s
            "columns",
            _zstd(struct.pack("<IBBB", 1, 1, 1, 1) + b"\x01\x00\x02k"),
            "not 0s and 1s",
        ),
    ],
)
@pytest.mark.parametrize("verified", [False, True])
def test_a_damaged_compressed_block_names_its_file_and_key_group(
    layout: str, block: bytes, problem: str, verified: bool
) -> None:
    # the block's crc32 is right (a writer damaged it before checksumming), so only decoding
    # can tell; ``verified`` is how compaction reads (no block checksums)
    data = _file_with_block(block, layout)
    assert _file_with_block(_zstd(_ONE), "columns") != data  # the good block decodes:
    good = DataFileReader(_file_with_block(_zstd(_ONE), "columns"), "ckpt/ok.kgd").block(2)
    assert good is not None and good.flat() == [b"k", b"vv"]
    reader = DataFileReader(data, "ckpt/7.kgd", verified=verified)
    found = reader.block(2)
    assert found is not None
    with pytest.raises(CorruptFileError, match=r"block of key group 2 at offset \d+") as err:
        found.flat()
    assert err.value.path == "ckpt/7.kgd"
    assert problem in str(err.value)


def test_a_codec_this_reader_lacks_is_refused_by_name() -> None:
    data = bytearray(encode_data_file({**HEADER, "codec": "zstd"}, [(1, [(b"k", b"v")])]))
    start = struct.calcsize("<8sHI") + 4
    (length,) = struct.unpack_from("<I", data, 10)
    header = bytes(data[start : start + length]).replace(b"zstd", b"lz9x")  # same length
    data[start : start + length] = header
    struct.pack_into("<I", data, start - 4, zlib.crc32(header))  # a well-formed header
    with pytest.raises(CorruptFileError, match="'lz9x', a codec this reader does not know"):
        DataFileReader(bytes(data), "ckpt/8.kgd")


@pytest.mark.parametrize(
    ("layout", "plain_version", "compressed_version"),
    [
        ("columns", COLUMNS_FORMAT_VERSION, COLUMNS_FORMAT_VERSION),
        ("msgpack", FORMAT_VERSION, COMPRESSED_FORMAT_VERSION),  # the formats from before
    ],
)
def test_none_leaves_the_codec_out_and_zstd_compresses(
    layout: str, plain_version: int, compressed_version: int
) -> None:
    pairs: list[tuple[int, list[tuple[bytes, bytes | None]]]] = [
        (kg, [(b"w%d" % (kg * 1000 + i), b"\x01") for i in range(500)]) for kg in range(4)
    ]
    header = {**HEADER, "layout": layout}
    plain = encode_data_file({**header, "codec": "none"}, pairs)
    assert plain == encode_data_file(header, pairs)  # no codec in the header
    assert DataFileReader(plain, "p").version == plain_version
    assert DataFileReader(plain, "p").layout == layout
    compressed = encode_data_file({**header, "codec": "zstd"}, pairs)
    reader = DataFileReader(compressed, "z")
    assert reader.version == compressed_version
    assert all(reader.read_block(kg) == sorted(pairs[kg][1]) for kg in range(4))  # a base
    assert len(compressed) < len(plain) / 2


@pytest.mark.parametrize("value", ["lz4", "gzip", ""])
def test_an_unknown_compression_setting_names_the_choices(value: Any) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(env={"STATETIER_CHECKPOINT_COMPRESSION": value})
    assert "checkpoint.compression" in str(err.value)
    assert "must be one of zstd, none" in str(err.value)
