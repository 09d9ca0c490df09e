"""Which kind of Spark session the driver side talks to, classic or Spark Connect, and the facts
of the application read the way each kind allows.

A classic session reaches the driver through py4j: ``sparkContext`` has the application id,
the conf and the master. A Spark Connect client is a gRPC process with no ``SparkContext``
(``JVM_ATTRIBUTE_NOT_SUPPORTED``); the same facts come from the session's runtime conf
(``spark.conf``), into which Spark copies the application's conf when it makes a session.

Where the pipeline's coordinator (host registry, commit, upkeep) runs decides which address it
listens on: in the classic driver, the driver's; in the Python process in which a Connect
server runs a streaming query's ``foreachBatch`` function, the driver's too (that process runs
beside the driver); in a Connect client, the address that routes to the Connect server (the
executors must reach the client, see docs/spark.md).
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from typing import Any, cast

from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "app_id",
    "client_address",
    "executor_count",
    "hosts_of",
    "is_connect",
    "master",
    "on_connect_driver",
    "plan_text",
    "session_conf",
]

# set by the Connect server in the Python process that runs a query's foreachBatch function
CONNECT_WORKER_URL = "SPARK_CONNECT_LOCAL_URL"
_COORDINATOR = uuid.uuid4().hex[:8]  # this process, as a Connect coordinator
_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*(\d+)\s*,")


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect session (no SparkContext, no py4j)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def on_connect_driver() -> bool:
    """Whether this process is the one a Connect server runs ``foreachBatch`` in (on the
    driver's machine)."""
    return CONNECT_WORKER_URL in os.environ


def session_conf(spark: SparkSession) -> dict[str, str]:
    """The application's Spark conf (``spark.statetier.*`` among it)."""
    if is_connect(spark):
        return {str(k): str(v) for k, v in spark.conf.getAll.items()}
    return {str(k): str(v) for k, v in spark.sparkContext.getConf().getAll()}


def app_id(spark: SparkSession) -> str:
    """The application's id (one registry and one set of state hosts per application)."""
    if is_connect(spark):
        return str(spark.conf.get("spark.app.id"))
    return str(spark.sparkContext.applicationId)


def hosts_of(spark: SparkSession) -> str:
    """Whose state hosts this process's coordinator uses: the application's (one registry per
    classic driver, and on a Connect server every query's ``foreachBatch`` process, which
    share the application's secret: see driver_secret); a Connect client's own within the
    application (it runs on another machine, so its registry's secret is its own and the
    application's hosts cannot know it; its hosts leave after ``host.idle-timeout`` once it
    ended)."""
    if is_connect(spark) and not on_connect_driver():
        return f"{app_id(spark)}-{_COORDINATOR}"
    return app_id(spark)


def master(spark: SparkSession) -> str:
    """The application's master URL (``local[...]``, ``local-cluster[...]``, ``k8s://...``)."""
    if is_connect(spark):
        return str(spark.conf.get("spark.master", "") or "")
    return str(spark.sparkContext.master or "")


def executor_count(spark: SparkSession, url: str) -> int:
    """How many executors the application of master ``url`` has: the driver's count on a
    classic session; on Connect, which cannot ask the scheduler, what the master or conf says
    (``local-cluster[N,...]``, ``spark.executor.instances``; 0: unknown, new ranges then go
    to the hosts that joined)."""
    if url.startswith("local") and not url.startswith("local-cluster"):
        return 1  # the driver is the executor
    if not is_connect(spark):
        status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()
        return max(0, int(status.size()) - 1)  # less the driver
    cluster = _LOCAL_CLUSTER.match(url)
    if cluster:
        return int(cluster.group(1))
    try:
        return int(spark.conf.get("spark.executor.instances", "0") or 0)
    except ValueError:
        return 0


def plan_text(df: DataFrame, mode: str = "extended") -> str:
    """A Connect DataFrame's plans as Spark prints them (``extended``: parsed, analyzed,
    optimized, physical; ``cost``: the optimized plan with each node's statistics; one analyze
    call): Connect shows plans as text only."""
    text: str = cast(Any, df)._explain_string(mode=mode)
    return text


def client_address(spark: SparkSession) -> str:
    """The address of this machine that routes to the Connect server of ``spark``, which the
    executors use to reach a coordinator in the client (no packet is sent)."""
    client = getattr(spark, "client", None)
    server = str(getattr(client, "host", "") or "127.0.0.1").strip("[]")
    family = socket.AF_INET6 if ":" in server else socket.AF_INET
    try:
        server = socket.gethostbyname(server) if family == socket.AF_INET else server
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((server, 9))
            address: str = probe.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())
    return address
