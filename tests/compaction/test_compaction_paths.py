"""Allowed prefixes: by path segment, no traversal, no foreign bucket, clear errors."""

from __future__ import annotations

import pytest
from statetier.compaction.paths import PathPolicy, RefusedPathError

POLICY = PathPolicy(["s3://bucket/ckpt", "file:///data/checkpoints/"])


@pytest.mark.parametrize(
    "url",
    [
        "s3://bucket/ckpt/app/data/epoch-0000000001/w/s/0-7.base.kgd",
        "s3://bucket/ckpt",
        "file:///data/checkpoints/app/x.kgd",
        "s3://bucket/ckpt/app/data/x/my%2Fstate/0-7.delta.kgd",  # quoted state names
    ],
)
def test_allowed(url: str) -> None:
    POLICY.check_url(url)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("s3://other/ckpt/x", "outside the allowed prefixes"),
        ("s3://bucket/ckpt-other/x", "outside the allowed prefixes"),
        ("s3://bucket/ckpt/../secret/x", "'..' path segment"),
        ("s3://bucket/ckpt/%2e%2e/secret", "'..' path segment"),
        ("s3://bucket/ckpt/a%2F..%2Fb", "'..' path segment"),
        ("s3://bucket/ckpt/./x", "'.' or '..'"),
        ("s3://bucket/ckpt//x", "empty"),
        ("s3://bucket/ckpt/x?versionId=1", "query"),
        ("s3://bucket/ckpt\\..\\x", "query, fragment"),
        ("gs://bucket/ckpt/x", "scheme 'gs' is not served"),
        ("/data/checkpoints/x", "not a URL"),
        ("file:///data/checkpoints/../../etc/passwd", "'..' path segment"),
        ("memory://bucket/ckpt/x", "outside the allowed prefixes"),
        # differently spelled or relative forms of an allowed location
        ("S3://bucket/ckpt/x", "write the scheme in lower case"),
        ("FILE:///data/checkpoints/x", "write the scheme in lower case"),
        ("file://data/checkpoints/x", "not an absolute file URL"),
        ("file://tmp/data/checkpoints/x", "not an absolute file URL"),
        ("file://localhost/data/checkpoints/x", "not an absolute file URL"),
        ("s3:///bucket/ckpt/x", "empty bucket name"),
        ("s3://Bucket/ckpt/x", "not a valid bucket name"),
        (" s3://bucket/ckpt/x", "scheme ' s3' is not served"),
        ("s3://bucket/ckpt/x y", "whitespace"),
        ("s3://bucket/ckpt/%5C..%5Cx", "'..' path segment"),
        # fsspec chains: fsspec would open the part before '::', not the whole text checked
        ("file:///data/checkpoints/o::file:/elsewhere/j1", "fsspec chain URL"),
        ("s3://bucket/ckpt/x::file:///data/checkpoints/y", "fsspec chain URL"),
    ],
)
def test_refused(url: str, reason: str) -> None:
    with pytest.raises(RefusedPathError, match=reason.replace("?", r"\?").replace("(", r"\(")):
        POLICY.check_url(url)


def test_a_prefix_must_name_a_bucket() -> None:
    with pytest.raises(ValueError, match="names no bucket"):
        PathPolicy(["s3://"])


@pytest.mark.parametrize("prefix", ["file://tmp/allowed", "FILE:///tmp/allowed", "s3:/bucket"])
def test_a_prefix_must_be_canonical(prefix: str) -> None:
    with pytest.raises(RefusedPathError, match="allowed prefix"):
        PathPolicy([prefix])


def test_a_relative_file_url_is_refused_even_where_it_would_spell_an_allowed_path() -> None:
    """``file://tmp/x/allowed/y`` is the relative path ``tmp/x/allowed/y`` to fsspec: under
    the worker's working directory, not under ``file:///tmp/x/allowed``."""
    policy = PathPolicy(["file:///tmp/x/allowed"])
    policy.check_url("file:///tmp/x/allowed/y.kgd")
    with pytest.raises(RefusedPathError, match="not an absolute file URL"):
        policy.check_url("file://tmp/x/allowed/y.kgd")
