"""The columnar block layout (format version 4) against a model: what goes in comes out, a
chain of blocks merges as the dict model says (later values win, tombstones remove, order by
key bytes), whatever mix of layouts the chain's files were written in; and compaction writes the
layout of its newest input."""

from __future__ import annotations

import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from statetier.backend.keygroups import KeyGroupRange
from statetier.backend.snapshot import columns
from statetier.backend.snapshot.compaction import CompactionInput, CompactionRequest, LocalCompactor
from statetier.backend.snapshot.format import (
    BASE,
    COLUMNS,
    DELTA,
    MSGPACK,
    DataFileReader,
    encode_data_file,
)
from statetier.backend.snapshot.merge import live_chain, merge_blocks, merge_columns

# keys that sort differently as bytes than as text, and prefixes of each other
KEYS = st.binary(max_size=6).map(lambda b: b.replace(b"\x01", b"\xff"))
VALUES = st.one_of(st.none(), st.binary(max_size=8), st.binary(min_size=250, max_size=300))
Entries = dict[bytes, bytes | None]


@settings(deadline=None)  # the first call loads Arrow's kernels
@given(st.dictionaries(KEYS, VALUES, max_size=40))
def test_a_block_decodes_to_what_was_encoded(entries: Entries) -> None:
    keys, values = list(entries), list(entries.values())
    encoded = columns.from_lists(keys, values)
    block = columns.encode(encoded)
    assert columns.encode_lists(keys, values) == block  # a delta's path, without the arrays
    decoded = columns.decode(block)
    assert decoded.to_flat() == [x for pair in entries.items() for x in pair]
    assert decoded.values.null_count == sum(v is None for v in values)  # b"" is no tombstone


@pytest.mark.parametrize("length", [255, 256, 65_535, 65_536, 200_000])
def test_lengths_take_the_width_their_longest_entry_needs(length: int) -> None:
    value = bytes(range(256)) * (length // 256) + b"x" * (length % 256)
    block = columns.encode(columns.from_lists([b"k", b"long"], [b"", value]))
    width = 1 if length < 256 else 2 if length < 65_536 else 4
    assert block[5] == width and block[4] == 1  # value lengths, key lengths
    assert columns.decode(block).to_flat() == [b"k", b"", b"long", value]


def _files(chain: list[tuple[str, Entries]], layouts: list[str]) -> list[DataFileReader]:
    files = []
    for epoch, ((kind, entries), layout) in enumerate(zip(chain, layouts, strict=True), 1):
        header = {"state": "s", "key_groups": "0-0", "epoch": epoch, "kind": kind}
        pairs = list(entries.items())
        data = encode_data_file({**header, "layout": layout, "codec": "zstd"}, [(0, pairs)])
        files.append(DataFileReader(data, f"{epoch}.kgd"))
    return files


def _model(chain: list[tuple[str, Entries]]) -> list[bytes | None]:
    state: Entries = {}
    for kind, entries in chain:
        if kind == BASE:
            state = {}
        state.update(entries)
    live = sorted((k, v) for k, v in state.items() if v is not None)
    return [x for pair in live for x in pair]


CHAINS = st.lists(
    st.tuples(st.sampled_from([BASE, DELTA]), st.dictionaries(KEYS, VALUES, max_size=30)),
    min_size=1,
    max_size=5,
).map(
    lambda c: [(k, {x: v for x, v in e.items() if v is not None} if k == BASE else e) for k, e in c]
)


@settings(max_examples=200, deadline=None)
@given(CHAINS, st.data())
def test_a_chain_merges_as_the_model_in_any_mix_of_layouts(
    chain: list[tuple[str, Entries]], data: st.DataObject
) -> None:
    layouts = data.draw(
        st.lists(st.sampled_from([COLUMNS, MSGPACK]), min_size=len(chain), max_size=len(chain))
    )
    files = live_chain(_files(chain, layouts))  # as compaction and restore do (see merge)
    blocks = [b for f in files if (b := f.block(0)) is not None]
    expected = _model(chain)
    assert merge_blocks(blocks) == expected
    assert merge_columns(blocks).to_flat() == expected


@pytest.mark.parametrize("newest", [COLUMNS, MSGPACK])
def test_compaction_writes_the_layout_of_its_newest_input(tmp_path: Path, newest: str) -> None:
    """A deployment whose writers are older than its compaction service keeps files they read;
    an untouched block of another layout is re-encoded, not copied."""
    key_groups = KeyGroupRange(0, 3)
    base = {kg: [(b"k%d-%d" % (kg, i), b"v%d" % i) for i in range(20)] for kg in key_groups}
    delta = {1: [(b"k1-0", None), (b"k1-new", b"n")]}
    other = MSGPACK if newest == COLUMNS else COLUMNS
    inputs = []
    files: list[tuple[str, dict[int, list[tuple[bytes, bytes | None]]], str]]
    files = [(BASE, base, other), (DELTA, delta, newest)]  # type: ignore[list-item]
    for epoch, (kind, blocks, layout) in enumerate(files, 1):
        header = {"state": "s", "key_groups": "0-3", "epoch": epoch, "kind": kind, "layout": layout}
        data = encode_data_file(header, list(blocks.items()))
        path = tmp_path / f"{epoch}.kgd"
        path.write_bytes(data)
        inputs.append(CompactionInput(f"file://{path}", len(data), zlib.crc32(data), kind, epoch))
    request = CompactionRequest(
        "j", "s", "0-3", inputs, f"file://{tmp_path}/out", max_parallelism=4
    )
    (output,) = LocalCompactor().compact(request).outputs
    data = Path(output.url.removeprefix("file://")).read_bytes()
    out = DataFileReader(data, "out")
    assert out.layout == newest and out.verify() == 80
    expected = sorted([p for p in base[1] if p[0] != b"k1-0"] + [(b"k1-new", b"n")])
    assert out.read_block(1) == expected
    assert [out.read_block(kg) for kg in (0, 2, 3)] == [sorted(base[kg]) for kg in (0, 2, 3)]


def test_the_block_codec_leaves_pandas_unimported() -> None:
    """``pa.array``, ``pa.repeat`` and a boolean array's ``to_numpy`` import pandas: 23 MiB of
    RSS in every process that writes or merges a checkpoint, which the memory governor counts."""
    script = (
        "import sys\n"
        "from statetier.backend.snapshot import columns as c\n"
        "x = c.from_lists([b'b', b'a', b'c'], [b'1', None, b''])\n"
        "y = c.sort_by_key(x)\n"
        "assert c.decode(c.encode(y)).to_flat() == [b'a', None, b'b', b'1', b'c', b'']\n"
        "assert c.merge([x, y]).to_flat() == [b'b', b'1', b'c', b'']\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pandas'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "[]"
