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
        "S3://bucket/ckpt/x",
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
        ("s3://bucket/ckpt\\..\\x", "query, fragment or control"),
        ("gs://bucket/ckpt/x", "scheme 'gs' is not served"),
        ("/data/checkpoints/x", "not a URL"),
        ("file:///data/checkpoints/../../etc/passwd", "'..' path segment"),
        ("memory://bucket/ckpt/x", "outside the allowed prefixes"),
    ],
)
def test_refused(url: str, reason: str) -> None:
    with pytest.raises(RefusedPathError, match=reason.replace("?", r"\?").replace("(", r"\(")):
        POLICY.check_url(url)


def test_a_prefix_must_name_a_bucket() -> None:
    with pytest.raises(ValueError, match="names no bucket"):
        PathPolicy(["s3://"])
