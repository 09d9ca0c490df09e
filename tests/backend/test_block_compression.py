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
    assert {(c, v) for _, c, v in _codecs(plain)} == {("none", FORMAT_VERSION)}
    plain.close()

    compressed = _runner(uri, "zstd")  # restores the plain chain, then adds compressed deltas
    compressed.process([("k1", 5), ("k2", 6)])
    compressed.checkpoint()
    expected = dump(compressed)
    kinds = _codecs(compressed)
    assert ("delta", "zstd", COMPRESSED_FORMAT_VERSION) in kinds
    assert ("base", "none", FORMAT_VERSION) in kinds
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


def _file_with_block(block: bytes, codec: str = "zstd") -> bytes:
    builder = DataFileBuilder({**HEADER, "codec": codec})
    parts = [builder.head, builder.add_raw(2, block, zlib.crc32(block), 1), builder.tail()]
    return b"".join(bytes(p) for p in parts)


@pytest.mark.parametrize(
    "block",
    [
        b"\x28\xb5\x2f\xfd not a frame",  # zstd's magic, then nothing zstd can read
        zstandard.ZstdCompressor().compress(b"\xc1"),  # a frame of bytes msgpack never uses
        zstandard.ZstdCompressor().compress(msgpack.packb([b"k", b"v", b"k2", b"v2"])),  # 2, not 1
    ],
)
@pytest.mark.parametrize("verified", [False, True])
def test_a_damaged_compressed_block_names_its_file_and_key_group(
    block: bytes, verified: bool
) -> None:
    # the block's crc32 is right (a writer damaged it before checksumming), so only decoding
    # can tell; ``verified`` is how compaction reads (no block checksums)
    reader = DataFileReader(_file_with_block(block), "ckpt/7.kgd", verified=verified)
    found = reader.block(2)
    assert found is not None
    with pytest.raises(CorruptFileError, match=r"block of key group 2 at offset \d+") as err:
        found.flat()
    assert err.value.path == "ckpt/7.kgd"


def test_a_codec_this_reader_lacks_is_refused_by_name() -> None:
    data = bytearray(encode_data_file({**HEADER, "codec": "zstd"}, [(1, [(b"k", b"v")])]))
    start = struct.calcsize("<8sHI") + 4
    (length,) = struct.unpack_from("<I", data, 10)
    header = bytes(data[start : start + length]).replace(b"zstd", b"lz9x")  # same length
    data[start : start + length] = header
    struct.pack_into("<I", data, start - 4, zlib.crc32(header))  # a well-formed header
    with pytest.raises(CorruptFileError, match="'lz9x', a codec this reader does not know"):
        DataFileReader(bytes(data), "ckpt/8.kgd")


def test_none_writes_the_format_from_before_compression() -> None:
    pairs: list[tuple[int, list[tuple[bytes, bytes | None]]]] = [
        (kg, [(b"w%d" % (kg * 1000 + i), b"\x01") for i in range(500)]) for kg in range(4)
    ]
    plain = encode_data_file({**HEADER, "codec": "none"}, pairs)
    assert plain == encode_data_file(HEADER, pairs)  # no codec in the header, version 2
    assert DataFileReader(plain, "p").version == FORMAT_VERSION
    compressed = encode_data_file({**HEADER, "codec": "zstd"}, pairs)
    reader = DataFileReader(compressed, "z")
    assert reader.version == COMPRESSED_FORMAT_VERSION
    assert all(reader.read_block(kg) == sorted(pairs[kg][1]) for kg in range(4))  # a base
    assert len(compressed) < len(plain) / 2


@pytest.mark.parametrize("value", ["lz4", "gzip", ""])
def test_an_unknown_compression_setting_names_the_choices(value: Any) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(env={"STATETIER_CHECKPOINT_COMPRESSION": value})
    assert "checkpoint.compression" in str(err.value)
    assert "must be one of zstd, none" in str(err.value)
