"""Fixtures of the compaction tests: SeaweedFS (a real S3 server) once per session, and a
fresh checkpoint prefix per test. Gateways and workers are started by each test with
:class:`statetier.tools.compaction_launch.Processes`, which stops them by process id."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from statetier.tools.compaction_launch import BUCKET, Processes, SeaweedFS


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    with SeaweedFS(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture
def prefix() -> str:
    """An allowed prefix of its own for each test."""
    return f"s3://{BUCKET}/ckpt-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def procs(tmp_path: Path, seaweed: SeaweedFS) -> Iterator[Processes]:
    with Processes(tmp_path, env=seaweed.env) as processes:
        yield processes
