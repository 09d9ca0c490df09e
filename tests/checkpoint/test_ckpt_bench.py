"""``statetier bench checkpoint`` measures what it says, on a real SeaweedFS.

Checkpoint blocks are compressed (zstd), so the benchmark's values must not compress away: with
one repeated character its 300k keys checkpointed to 4 MiB instead of 55, the fixed cost of a
commit dominated, and the incremental checkpoint read as 12% of a full one in both the tree
before and after a change.
"""

from __future__ import annotations

import zstandard
from statetier.tools.bench.checkpoint import payload_of, run

from tests.checkpoint.ckpt_support import S3Server

KEYS = 4_000
VALUE_BYTES = 150


def test_the_values_do_not_compress_away_and_are_one_per_key() -> None:
    values = [payload_of(i, VALUE_BYTES) for i in range(200)]
    assert len(set(values)) == len(values)
    assert values == [payload_of(i, VALUE_BYTES) for i in range(200)]  # a restore checks them
    assert all(len(v) == len(f"{i}:") + VALUE_BYTES for i, v in enumerate(values))
    raw = "".join(values).encode()
    assert len(zstandard.ZstdCompressor(level=1).compress(raw)) > 0.7 * len(raw)


def test_the_checkpoint_holds_the_values_bytes_and_a_delta_only_the_changed_keys(
    seaweedfs: S3Server,
) -> None:
    report = run(seaweedfs.endpoint, KEYS, VALUE_BYTES, repeats=1)
    # the compressed checkpoint still holds most of the payload's bytes
    assert report["full_mb"] * 2**20 > 0.6 * KEYS * VALUE_BYTES, report
    # 1% of the keys changed: the delta is a few percent of a full checkpoint at most
    assert 0 < report["incremental_bytes_ratio"] <= 0.05, report
