"""Key-group columns read as NumPy arrays without pyarrow's pandas layer (integer_columns): a
task's cut of its records and the state host's path for Arrow functions leave pandas unimported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from statetier.backend.integer_columns import int64_values

REPO = Path(__file__).resolve().parents[2]


def write_stream(table: pa.Table, path: Path, chunk: int) -> None:
    """``table`` as an Arrow IPC stream of batches of ``chunk`` rows, for a subprocess that has
    not imported pandas to read (building the table here may import it)."""
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=chunk)


def test_chunks_are_read_from_their_buffers_at_any_offset() -> None:
    whole = pa.array(list(range(100)), pa.int64())
    column = pa.chunked_array([whole.slice(10, 5), whole.slice(90, 10), whole.slice(0, 0)])
    values = int64_values(column)
    assert values.dtype == np.int64
    assert values.tolist() == [*range(10, 15), *range(90, 100)]
    assert int64_values(pa.chunked_array([], pa.int64())).tolist() == []


@pytest.mark.parametrize("kind", [pa.int8(), pa.int16(), pa.int32(), pa.uint16(), pa.uint32()])
def test_every_integer_width_reads_as_int64(kind: pa.DataType) -> None:
    values = [0, 5, 100, 127]
    if pa.types.is_signed_integer(kind):
        values.append(-3)
    array = pa.array([7, *values], kind).slice(1)  # an offset of one element of this width
    read = int64_values(array)
    assert read.dtype == np.int64 and read.tolist() == values


def test_nulls_and_other_types_are_converted_as_to_numpy_converts_them() -> None:
    with_nulls = int64_values(pa.chunked_array([pa.array([1, None, 3], pa.int64())]))
    assert with_nulls[0] == 1 and np.isnan(with_nulls[1]) and with_nulls[2] == 3
    assert int64_values(pa.array([1.5, 2.0])).tolist() == [1.5, 2.0]


def test_a_host_runs_an_arrow_function_without_importing_pandas(tmp_path: Path) -> None:
    """A :class:`KeyGroupFunction` that answers with Arrow: the host checks the range's key
    groups and cuts the records by key group with no pandas (its first task imported it
    through ``to_numpy`` and ``pa.array``: 0.3-0.9 s and 36 MiB in every host)."""
    words = [f"w{i % 37}" for i in range(2000)]
    key_groups = [sum(w.encode()) % 32 for w in words]  # any key group inside range 0 of 1
    table = pa.table({"word": words, "__statetier_kg": pa.array(key_groups, pa.int32())})
    write_stream(table, tmp_path / "in.arrow", 300)
    code = (
        "import json, sys, pyarrow as pa, pyarrow.compute as pc\n"
        "from statetier.backend.runtime import FunctionInstance\n"
        "from statetier.backend.spark.functions import KeyGroupFunction\n"
        "from statetier.backend.spark.processing import process\n"
        "class Lengths(KeyGroupFunction):  # pandas-free itself (Arrow's group_by is not)\n"
        "    def process_key_group(self, key_group, records, context):\n"
        "        lengths = pc.cast(pc.utf8_length(records['word']), pa.int64())\n"
        "        return pa.Table.from_arrays([records['word'], lengths], ['word', 'count'])\n"
        f"batches = list(pa.ipc.open_stream(pa.OSFile({str(tmp_path / 'in.arrow')!r})))\n"
        "schema = pa.schema([('word', pa.string()), ('count', pa.int64())])\n"
        "out = process(FunctionInstance(Lengths, 0, 1, 32), batches, ['word'], 0, schema)\n"
        "rows = sorted(r for b in out for r in zip(*(c.to_pylist() for c in b.columns)))\n"
        "print(json.dumps({'rows': rows, 'pandas': 'pandas' in sys.modules}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    expected = sorted([w, len(w)] for w in words)
    assert json.loads(done.stdout) == {"rows": expected, "pandas": False}


def test_a_task_cuts_its_records_without_importing_pandas(tmp_path: Path) -> None:
    """A Spark worker that runs mapInArrow has not imported pandas, and ChunkedArray.to_numpy
    would (0.3 s at each new worker's first task): the cut takes none of it."""
    from statetier.backend.spark.functions import KEY_GROUP_COLUMN

    kg = np.random.default_rng(5).integers(0, 128, 3000)
    table = pa.table({"word": [f"w{i}" for i in range(3000)], KEY_GROUP_COLUMN: kg})
    write_stream(table, tmp_path / "in.arrow", 700)
    code = (
        "import json, sys, pyarrow as pa\n"
        "from statetier.backend.spark.task import split_ranges\n"
        f"batches = list(pa.ipc.open_stream(pa.OSFile({str(tmp_path / 'in.arrow')!r})))\n"
        "slices = split_ranges([b.slice(1) for b in batches], 4, 128)\n"
        "rows = [sum(b.num_rows for b in s) for s in slices]\n"
        "print(json.dumps({'rows': rows, 'pandas': 'pandas' in sys.modules}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    kept = np.concatenate([kg[n + 1 : n + 700] for n in range(0, 3000, 700)])
    expected = [int(((kept * 4) // 128 == i).sum()) for i in range(4)]
    assert json.loads(done.stdout) == {"rows": expected, "pandas": False}
