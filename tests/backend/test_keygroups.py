"""Key groups: a stable hash, Flink's range and owner formulas, and the Spark SQL form."""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys

import pytest
import xxhash
from statetier.backend.keygroups import (
    SEED,
    KeyGroupRange,
    assign_str_to_key_group,
    assign_to_key_group,
    compute_default_max_parallelism,
    instance_for_key_group,
    key_group_range_for_instance,
    key_hash,
    spark_key_group_expr,
)

# --------------------------------------------------------------------------- reference XXH64

_M64 = (1 << 64) - 1
_P1 = 0x9E3779B185EBCA87
_P2 = 0xC2B2AE3D27D4EB4F
_P3 = 0x165667B19E3779F9
_P4 = 0x85EBCA77C2B2AE63
_P5 = 0x27D4EB2F165667C5


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _round(acc: int, lane: int) -> int:
    acc = (acc + lane * _P2) & _M64
    return (_rotl(acc, 31) * _P1) & _M64


def _merge(acc: int, val: int) -> int:
    acc ^= _round(0, val)
    return (acc * _P1 + _P4) & _M64


def ref_xxh64(data: bytes, seed: int) -> int:
    """XXH64 written from the specification, independent of the xxhash package."""
    n = len(data)
    i = 0
    if n >= 32:
        v1 = (seed + _P1 + _P2) & _M64
        v2 = (seed + _P2) & _M64
        v3 = seed
        v4 = (seed - _P1) & _M64
        while i + 32 <= n:
            lanes = struct.unpack_from("<4Q", data, i)
            v1, v2 = _round(v1, lanes[0]), _round(v2, lanes[1])
            v3, v4 = _round(v3, lanes[2]), _round(v4, lanes[3])
            i += 32
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _M64
        for v in (v1, v2, v3, v4):
            h = _merge(h, v)
    else:
        h = (seed + _P5) & _M64
    h = (h + n) & _M64
    while i + 8 <= n:
        (lane,) = struct.unpack_from("<Q", data, i)
        h ^= _round(0, lane)
        h = (_rotl(h, 27) * _P1 + _P4) & _M64
        i += 8
    if i + 4 <= n:
        (word,) = struct.unpack_from("<I", data, i)
        h ^= (word * _P1) & _M64
        h = (_rotl(h, 23) * _P2 + _P3) & _M64
        i += 4
    while i < n:
        h ^= (data[i] * _P5) & _M64
        h = (_rotl(h, 11) * _P1) & _M64
        i += 1
    h ^= h >> 33
    h = (h * _P2) & _M64
    h ^= h >> 29
    h = (h * _P3) & _M64
    h ^= h >> 32
    return h


def signed(h: int) -> int:
    return h - (1 << 64) if h >= 1 << 63 else h


def test_reference_xxh64_matches_specification_vectors() -> None:
    # Vectors from the xxHash specification / reference implementation.
    assert ref_xxh64(b"", 0) == 0xEF46DB3751D8E999
    assert ref_xxh64(b"a", 0) == 0xD24EC4F1A98C6E5B
    assert ref_xxh64(b"abc", 0) == 0x44BC2CF5AD770999
    rng = random.Random(7)
    for length in [*range(70), 100, 257]:
        data = bytes(rng.randrange(256) for _ in range(length))
        seed = rng.randrange(1 << 64)
        assert ref_xxh64(data, seed) == xxhash.xxh64_intdigest(data, seed)


def test_spark_sql_documented_xxhash64_value() -> None:
    # Spark SQL reference: SELECT xxhash64('Spark', array(123), 2) -> 5602566077635097486.
    # IntegerType hashes as 4 little-endian bytes; BinaryType hashes its bytes as they are, so
    # a tuple key of a string and two 4-byte binaries chains to exactly the same value.
    key = ("Spark", struct.pack("<i", 123), struct.pack("<i", 2))
    assert key_hash(key) == 5602566077635097486


def test_null_key_hashes_to_the_seed_as_in_spark() -> None:
    # Spark SQL: xxhash64(NULL) = 42 (a null column leaves the seed unchanged).
    assert key_hash(None) == SEED == 42
    assert key_hash(("a", None)) == key_hash(("a",))


@pytest.mark.parametrize("text", ["hello", "", "Spark", "héllo wörld ✓", "x" * 100])
def test_string_key_hash_is_xxh64_of_utf8_seed_42_signed(text: str) -> None:
    expected = signed(ref_xxh64(text.encode("utf-8"), 42))
    assert key_hash(text) == expected
    assert key_hash(text) == signed(xxhash.xxh64_intdigest(text.encode("utf-8"), seed=42))
    assert key_hash((text,)) == expected  # a one-field tuple is the same column


@pytest.mark.parametrize("value", [0, 1, -1, 123, 2**63 - 1, -(2**63), 2**40 + 17])
def test_int_key_hash_is_spark_long(value: int) -> None:
    assert key_hash(value) == signed(ref_xxh64(struct.pack("<q", value), 42))


def test_bytes_and_tuple_keys() -> None:
    assert key_hash(b"\x00\xff") == signed(ref_xxh64(b"\x00\xff", 42))
    assert key_hash(bytearray(b"ab")) == key_hash(b"ab") == key_hash(memoryview(b"ab"))
    h = ref_xxh64(b"user", 42)
    h = ref_xxh64(struct.pack("<q", 7), h)
    h = ref_xxh64(b"\x01", h)
    assert key_hash(("user", 7, b"\x01")) == signed(h)
    # Field order matters: the hash chains, it does not combine commutatively.
    assert key_hash(("a", "b")) != key_hash(("b", "a"))


def test_key_group_is_pmod_of_signed_hash() -> None:
    negative = next(f"k{i}" for i in range(1000) if key_hash(f"k{i}") < 0)
    for max_parallelism in (1, 7, 128, 32768):
        kg = assign_to_key_group(negative, max_parallelism)
        assert 0 <= kg < max_parallelism
        # Java/Spark pmod: ((h % m) + m) % m
        h = key_hash(negative)
        java_rem = h - max_parallelism * int(h / max_parallelism)
        assert kg == (java_rem + max_parallelism) % max_parallelism


def test_str_key_group_shortcut_agrees_with_the_general_path() -> None:
    """The backend's shortcut for new str keys: same key group as assign_to_key_group, for
    keys of either hash sign."""
    keys = [f"k{i}" for i in range(200)] + ["", "héllo wörld ✓"]
    assert {key_hash(k) < 0 for k in keys} == {True, False}
    for max_parallelism in (1, 7, 128, 32768):
        for key in keys:
            assert assign_str_to_key_group(key, max_parallelism) == assign_to_key_group(
                key, max_parallelism
            )


@pytest.mark.parametrize(
    ("key", "fragment"),
    [
        (True, "bool"),
        (False, "bool"),
        (("a", True), "bool"),
        (1.5, "float"),
        (1.0, "float"),
        (2**63, "64 bits"),
        (-(2**63) - 1, "64 bits"),
        (("a", 2**64), "64 bits"),
        ([1, 2], "list"),
        (frozenset({1}), "frozenset"),
        ({"a": 1}, "dict"),
    ],
)
def test_unsupported_keys_are_refused(key: object, fragment: str) -> None:
    with pytest.raises(TypeError, match=fragment):
        assign_to_key_group(key, 128)


# --------------------------------------------------------------------------- PYTHONHASHSEED

KEYS: list[object] = [
    "",
    "hello",
    "statetier",
    "ünïcödé",
    *[f"word{i}" for i in range(200)],
    0,
    1,
    -1,
    2**62,
    -(2**63),
    *list(range(-50, 50, 7)),
    b"",
    b"\x00\x01\x02",
    b"bytes-key",
    ("a", 1),
    ("user", b"\xff", -5),
    ("x",),
    (),
    None,
]

_CHILD = """
import json, sys
from statetier.backend.keygroups import assign_to_key_group, key_hash
keys = eval(sys.stdin.read())
print(json.dumps({
    "python_hash": hash("statetier-hash-probe"),
    "hashes": [key_hash(k) for k in keys],
    "groups": [[assign_to_key_group(k, p) for p in (128, 4096, 32768)] for k in keys],
}))
"""


def _run_child(seed: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD],
        input=repr(KEYS),
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_key_groups_identical_across_pythonhashseed_values() -> None:
    results = {seed: _run_child(seed) for seed in ("0", "1", "random", "4242")}
    # The processes really had different string hashing...
    assert len({r["python_hash"] for r in results.values()}) > 1
    # ...yet every key lands in the same key group, with the same hash, in all of them.
    expected_hashes = [key_hash(k) for k in KEYS]
    expected_groups = [[assign_to_key_group(k, p) for p in (128, 4096, 32768)] for k in KEYS]
    for seed, result in results.items():
        assert result["hashes"] == expected_hashes, seed
        assert result["groups"] == expected_groups, seed


# --------------------------------------------------------------------------- Flink formulas


def flink_range(max_parallelism: int, parallelism: int, index: int) -> tuple[int, int]:
    """KeyGroupRangeAssignment.computeKeyGroupRangeForOperatorIndex, literally."""
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism - 1) // parallelism
    return start, end


def _check_ranges(max_parallelism: int, parallelism: int, exhaustive: bool) -> None:
    ranges = [
        key_group_range_for_instance(max_parallelism, parallelism, i) for i in range(parallelism)
    ]
    assert ranges[0].start == 0
    assert ranges[-1].end == max_parallelism - 1
    for i, kg_range in enumerate(ranges):
        assert (kg_range.start, kg_range.end) == flink_range(max_parallelism, parallelism, i)
        assert len(kg_range) >= 1  # parallelism <= max parallelism: nobody is left empty
        if i:
            assert kg_range.start == ranges[i - 1].end + 1  # contiguous and disjoint
        # The owner formula agrees at both ends, and its neighbours belong to the neighbours;
        # the owner is monotonic in the key group, so everything in between is i's too.
        owner = instance_for_key_group
        assert owner(max_parallelism, parallelism, kg_range.start) == i
        assert owner(max_parallelism, parallelism, kg_range.end) == i
        if kg_range.start:
            assert owner(max_parallelism, parallelism, kg_range.start - 1) == i - 1
        if kg_range.end < max_parallelism - 1:
            assert owner(max_parallelism, parallelism, kg_range.end + 1) == i + 1
        if exhaustive:
            for kg in kg_range:
                assert owner(max_parallelism, parallelism, kg) == i
    sizes = {len(r) for r in ranges}
    assert max(sizes) - min(sizes) <= 1  # as even as integers allow


def test_ranges_match_flink_for_max_parallelism_128_every_parallelism() -> None:
    for parallelism in range(1, 129):
        _check_ranges(128, parallelism, exhaustive=True)


def test_ranges_match_flink_for_max_parallelism_32768() -> None:
    rng = random.Random(32768)
    sampled = {*range(1, 301), *rng.sample(range(301, 32769), 25), 16384, 32767, 32768}
    for parallelism in sorted(sampled):
        _check_ranges(32768, parallelism, exhaustive=False)
    for parallelism in (1, 3, 7, 300, 32767, 32768):
        _check_ranges(32768, parallelism, exhaustive=True)


def test_key_group_range_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="parallelism"):
        key_group_range_for_instance(128, 129, 0)
    with pytest.raises(ValueError, match="parallelism"):
        key_group_range_for_instance(128, 0, 0)
    with pytest.raises(ValueError, match="max parallelism"):
        key_group_range_for_instance(32769, 1, 0)
    with pytest.raises(ValueError, match="instance index"):
        key_group_range_for_instance(128, 4, 4)
    with pytest.raises(ValueError, match="instance index"):
        key_group_range_for_instance(128, 4, -1)


def test_keys_land_in_the_range_of_their_owner() -> None:
    for max_parallelism, parallelism in ((128, 3), (128, 128), (32768, 7), (1000, 999)):
        for i in range(500):
            kg = assign_to_key_group(f"key-{i}", max_parallelism)
            owner = instance_for_key_group(max_parallelism, parallelism, kg)
            assert kg in key_group_range_for_instance(max_parallelism, parallelism, owner)


def test_key_group_range_type() -> None:
    r = KeyGroupRange(4, 7)
    assert list(r) == [4, 5, 6, 7] and len(r) == 4
    assert 4 in r and 7 in r and 8 not in r and "5" not in r
    assert len(KeyGroupRange(5, 4)) == 0 and list(KeyGroupRange(5, 4)) == []
    assert KeyGroupRange.parse(str(r)) == r and str(r) == "4-7"
    assert KeyGroupRange.of(128) == KeyGroupRange(0, 127)
    assert r.intersection(KeyGroupRange(6, 20)) == KeyGroupRange(6, 7)
    assert len(r.intersection(KeyGroupRange(8, 20))) == 0


# --------------------------------------------------------------------------- default max par.


def flink_default_max_parallelism(parallelism: int) -> int:
    """KeyGroupRangeAssignment.computeDefaultMaxParallelism, literally."""
    wanted = parallelism + parallelism // 2
    power = 1
    while power < wanted:
        power *= 2
    return min(max(power, 128), 32768)


@pytest.mark.parametrize(
    ("parallelism", "expected"),
    [
        (1, 128),
        (2, 128),
        (85, 128),
        (86, 256),
        (100, 256),
        (170, 256),
        (171, 256),
        (172, 512),
        (1000, 2048),
        (20000, 32768),
        (21845, 32768),
        (21846, 32768),
        (32768, 32768),
    ],
)
def test_default_max_parallelism_table(parallelism: int, expected: int) -> None:
    assert compute_default_max_parallelism(parallelism) == expected


def test_default_max_parallelism_matches_flink_everywhere() -> None:
    for parallelism in range(1, 32769):
        assert compute_default_max_parallelism(parallelism) == flink_default_max_parallelism(
            parallelism
        )
    with pytest.raises(ValueError, match="at least 1"):
        compute_default_max_parallelism(0)


@pytest.mark.parametrize("parallelism", [32769, 40000, 1 << 20])
def test_a_parallelism_above_32768_is_refused_not_clamped(parallelism: int) -> None:
    """Flink's KeyGroupRangeAssignment caps the max parallelism at 32768 (UPPER_BOUND) and
    checks 1 <= parallelism <= max parallelism: a larger parallelism is an error, never a
    silently smaller max parallelism."""
    with pytest.raises(ValueError, match=rf"parallelism {parallelism} is above .*32768"):
        compute_default_max_parallelism(parallelism)
    with pytest.raises(ValueError, match=r"parallelism must be in 1\.\.max parallelism"):
        key_group_range_for_instance(32768, parallelism, 0)


# --------------------------------------------------------------------------- Spark SQL form


def test_spark_key_group_expr() -> None:
    assert spark_key_group_expr(["word"], 128) == "pmod(xxhash64(`word`), 128)"
    assert spark_key_group_expr(["user", "day"], 32768) == "pmod(xxhash64(`user`, `day`), 32768)"
    assert spark_key_group_expr(["we`ird"], 4) == "pmod(xxhash64(`we``ird`), 4)"
    with pytest.raises(ValueError, match="at least one"):
        spark_key_group_expr([], 128)
