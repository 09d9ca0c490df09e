"""A local Spark Connect server for tests, benchmarks and examples, on 127.0.0.1.

``SparkSession.builder.remote("local[2]")`` starts a Connect server inside the client's own
Python (a classic driver over py4j) and listens on every interface at port 15002, which parallel
runs share. This one is a separate ``SparkConnectServer`` process, as on a cluster: the client
that talks to it has no JVM at all, so nothing of the classic driver can be used by mistake. It
binds gRPC and the driver to 127.0.0.1 on a free port, runs the given master (``local[2]``,
``local-cluster[2,1,1024]``) with the given conf, and is stopped by :meth:`ConnectServer.stop`
(or the context manager), with the executors and Python workers it started.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO

from statetier.tools.lifetime import die_with_parent, stop_process
from statetier.tools.ports import free_port

__all__ = ["ConnectServer", "spark_home"]

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def spark_home() -> str:
    """The installed pyspark package, which holds Spark's jars and scripts."""
    import pyspark

    return str(Path(pyspark.__file__).parent)


class ConnectServer:
    """A running ``SparkConnectServer`` process; :attr:`url` is what ``remote()`` takes."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, log: IO[bytes]) -> None:
        self.process = process
        self.port = port
        self.url = f"sc://127.0.0.1:{port}"
        self._log = log

    @classmethod
    def start(
        cls,
        log_path: Path,
        master: str = "local[2]",
        conf: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 180.0,
    ) -> ConnectServer:
        """Start a server running ``master`` with ``conf``; its Python workers run this
        interpreter with ``env`` added (PYTHONPATH for the code they must import)."""
        port = free_port()
        settings = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(port),
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.host": "127.0.0.1",
            "spark.ui.enabled": "false",
            **(conf or {}),
        }
        home = spark_home()
        command = [f"{home}/bin/spark-submit", "--class", SERVER_CLASS, "--master", master]
        for key, value in settings.items():
            command += ["--conf", f"{key}={value}"]
        command += ["--name", "statetier-connect", "spark-internal"]
        environment = {
            **os.environ,
            "SPARK_HOME": home,
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_CONNECT_MODE": "0",  # spark-submit runs the classic driver
            **(env or {}),
        }
        environment.pop("SPARK_REMOTE", None)
        log = open(log_path, "wb")  # noqa: SIM115 - closed by stop()
        # a session of its own so that stop() reaches the executors and workers it started; it
        # ends with this process, even one killed by SIGKILL (statetier.tools.lifetime)
        process = subprocess.Popen(
            command, env=environment, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=die_with_parent(),  # noqa: PLW1509 - only prctl
        )  # fmt: skip
        server = cls(process, port, log)
        try:
            server._wait_ready(log_path, timeout)
        except BaseException:
            server.stop()
            raise
        return server

    def _wait_ready(self, log_path: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the Spark Connect server exited: {tail}")
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.5).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the Spark Connect server did not listen within {timeout:.0f}s "
                        f"(log: {log_path})"
                    ) from None
                time.sleep(0.2)

    def stop(self) -> None:
        """Stop the server and everything it started (its process group)."""
        stop_process(self.process, 30, group=True)
        self._log.close()

    def __enter__(self) -> ConnectServer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
