"""The embedded S3 server of the tests, demo and benchmarks leaves nothing behind it: by
default ``weed mini`` puts its S3 and filer sockets, its components' gRPC sockets and its WebDAV
chunk cache in /tmp and never removes them (hundreds had piled up on a development machine);
and it reports nothing to SeaweedFS's telemetry service."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from statetier.tools.seaweed import SeaweedFS

# what weed mini leaves in /tmp by default: sockets, and chunk-cache directories of 8 hex digits
WEED_LITTER = re.compile(
    r"^(seaweedfs-(s3|filer)-\d+\.sock|seaweedfs-\w+-grpc-\d+\.sock|[0-9a-f]{8}|statetier-weed-.*)$"
)


def weed_entries() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).iterdir() if WEED_LITTER.match(p.name)}


def test_a_stopped_server_leaves_nothing_outside_its_data_directory(tmp_path: Path) -> None:
    before = weed_entries()
    with SeaweedFS.start(tmp_path / "weed") as server:
        during = weed_entries() - before
        assert [p.name for p in server._sockets.iterdir()] != []  # its sockets, out of /tmp's top
    grpc = {name for name in during if "-grpc-" in name}
    assert {name.split("-")[1] for name in grpc} == {"master", "volume", "filer", "s3", "admin"}
    assert weed_entries() - before == set()  # its gRPC sockets too, removed by stop()
    assert not server._sockets.exists()
    assert during - grpc <= {server._sockets.name}
    log = (tmp_path / "weed" / "weed.log").read_text()
    assert "anonymous cluster statistics" not in log  # -master.telemetry=false
