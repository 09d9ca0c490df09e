"""The embedded S3 server of the tests, demo and benchmarks leaves nothing behind it: by
default ``weed mini`` puts its S3 and filer sockets and its WebDAV chunk cache in /tmp and
never removes them (hundreds had piled up on a development machine)."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from statetier.tools.seaweed import SeaweedFS

# what weed mini leaves in /tmp by default: sockets, and chunk-cache directories of 8 hex digits
WEED_LITTER = re.compile(r"^(seaweedfs-(s3|filer)-\d+\.sock|[0-9a-f]{8}|statetier-weed-.*)$")


def weed_entries() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).iterdir() if WEED_LITTER.match(p.name)}


def test_a_stopped_server_leaves_nothing_outside_its_data_directory(tmp_path: Path) -> None:
    before = weed_entries()
    with SeaweedFS.start(tmp_path / "weed") as server:
        during = weed_entries() - before
        assert [p.name for p in server._sockets.iterdir()] != []  # its sockets, out of /tmp's top
    assert weed_entries() - before - during == set()
    assert not server._sockets.exists()
    assert during <= {server._sockets.name}
    assert (tmp_path / "weed" / "webdav-cache").is_dir()
