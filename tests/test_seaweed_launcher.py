"""The embedded S3 server of the tests, demo and benchmarks leaves nothing behind it: by
default ``weed mini`` puts its S3 and filer sockets, its components' gRPC sockets and its WebDAV
chunk cache in /tmp and never removes them (hundreds had piled up on a development machine);
and it reports nothing to SeaweedFS's telemetry service."""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path

from statetier.tools.seaweed import SeaweedFS

# what weed mini leaves in /tmp by default: sockets, and chunk-cache directories of 8 hex digits
WEED_LITTER = re.compile(
    r"^(seaweedfs-(s3|filer)-\d+\.sock|seaweedfs-\w+-grpc-\d+\.sock|[0-9a-f]{8}|statetier-weed-.*)$"
)


def weed_entries() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).iterdir() if WEED_LITTER.match(p.name)}


def test_a_stopped_server_leaves_nothing_outside_its_data_directory(tmp_path: Path) -> None:
    # Other servers may start and stop meanwhile (make test runs two workers): only this
    # server's gRPC sockets and the kinds of litter no launched server may leave are judged.
    before = weed_entries()
    with SeaweedFS.start(tmp_path / "weed") as server:
        own = set(server._grpc_sockets)
        # weed mini makes some components' sockets only after its S3 port answers (the
        # admin's last, seconds later on a busy machine)
        deadline = time.monotonic() + 30
        while not all(p.exists() for p in own) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert {p.name.split("-")[1] for p in own if p.exists()} == {
            "master", "volume", "filer", "s3", "admin"
        }  # fmt: skip
        during = weed_entries() - before
        assert [p.name for p in server._sockets.iterdir()] != []  # its sockets, out of /tmp's top
    assert not [p for p in own if p.exists()]  # its gRPC sockets too, removed by stop()
    assert not server._sockets.exists()
    litter = {n for n in during if "-grpc-" not in n and not n.startswith("statetier-weed-")}
    assert litter == set()  # no S3 or filer socket, no chunk cache in /tmp
    log = (tmp_path / "weed" / "weed.log").read_text()
    assert "anonymous cluster statistics" not in log  # -master.telemetry=false
