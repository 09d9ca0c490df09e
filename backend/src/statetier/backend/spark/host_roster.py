"""The state hosts the coordinators on one Spark Connect driver have seen, so that a new query's
coordinator invites them before its first micro-batch.

On a Connect server each streaming query's ``foreachBatch`` process coordinates its pipeline with
a registry of its own, and the queries share the executors' hosts (driver_secret, membership). A
host joins a registry when a task names it, so a new coordinator's registry knows no host before
its first micro-batch: that micro-batch cannot be routed from one task (``direct``) and goes
through Spark's exchange, and its tasks wait for their hosts to register. The coordinators
therefore keep a roster of the hosts they saw register, in a file beside the shared secret
(``statetier-<app>.hosts``, this user's alone); a new coordinator reads it and asks each host
to join its registry (the ``join`` request a task sends, authenticated with the shared secret)
before it plans its first micro-batch.

The roster is a hint, never the truth: a host it names that has gone is not reached and is
skipped, one it misses joins at its first task as before, and two coordinators writing it at
once leave one's view (each write replaces the file whole). A file that another user owns or
others may read is not used.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterable

from statetier.backend.spark.channel import Endpoint
from statetier.backend.spark.driver_secret import SecretFileError, driver_file_path, read_private
from statetier.backend.spark.membership import JoinError, ask_to_join
from statetier.backend.spark.registry import HostInfo, HostRegistry

__all__ = [
    "INVITE_TIMEOUT_S",
    "invite",
    "read_roster",
    "roster_path",
    "share_hosts",
    "write_roster",
]

log = logging.getLogger("statetier.spark.roster")

INVITE_TIMEOUT_S = 2.0  # how long a new coordinator waits for the roster's hosts to join


def roster_path(app_id: str, directory: str | None = None) -> str:
    """Where the host roster of application ``app_id`` lives on this machine."""
    return driver_file_path(app_id, ".hosts", directory)


def write_roster(path: str, hosts: Iterable[HostInfo]) -> None:
    """Replace the roster at ``path`` with ``hosts`` (written aside, mode 0600, then renamed
    into place, so a reader sees a whole roster). A failure is logged, not raised: the roster
    only saves a new coordinator time."""
    text = json.dumps([host.to_json() for host in hosts])
    try:
        fd, aside = tempfile.mkstemp(prefix=".statetier-", dir=os.path.dirname(path))
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(aside, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(aside)
            raise
    except OSError as e:
        log.warning("statetier's host roster %s was not written: %s", path, e)


def read_roster(path: str) -> list[HostInfo]:
    """The hosts the roster at ``path`` names; none when there is no roster, or when it is not
    this user's alone or not a roster (both logged)."""
    try:
        text = read_private(path, "host roster")
    except SecretFileError as e:
        log.warning("%s (not used)", e)
        return []
    except OSError:
        return []
    try:
        return [HostInfo.from_json(item) for item in json.loads(text)]
    except (ValueError, TypeError) as e:
        log.warning("statetier's host roster %s is not a roster (%s): not used", path, e)
        return []


def invite(
    hosts: list[HostInfo], registry: Endpoint, secret: bytes, timeout: float = INVITE_TIMEOUT_S
) -> list[str]:
    """Ask each of ``hosts`` to join ``registry``, all at once; the ids of those that joined
    within ``timeout`` (a host answers once it is registered there). ``timeout`` bounds the
    whole invitation, however many hosts and endpoints do not answer."""
    deadline = time.monotonic() + timeout
    joined: list[str] = []
    threads = [
        threading.Thread(
            target=_invite_one,
            args=(host, registry, secret, deadline, joined),
            name="statetier-invite",
            daemon=True,
        )
        for host in hosts
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return list(joined)


def _invite_one(
    host: HostInfo, registry: Endpoint, secret: bytes, deadline: float, joined: list[str]
) -> None:
    """Ask ``host`` to join ``registry`` at its first endpoint that answers before ``deadline``
    (``time.monotonic``)."""
    for endpoint in host.endpoints:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            ask_to_join(endpoint, secret, registry, left, answer_timeout=left)
        except JoinError as e:
            log.debug("state host %s did not join: %s", host.host_id, e)
            return
        except (OSError, EOFError) as e:  # gone, another machine's socket path, refused
            log.debug("state host %s not invited at %s: %s", host.host_id, endpoint, e)
            continue
        joined.append(host.host_id)
        return


def share_hosts(registry: HostRegistry, app_id: str, directory: str | None = None) -> None:
    """Keep ``registry``'s hosts on application ``app_id``'s roster from now on, and ask the
    hosts the roster names to join it now (once per registry: a registry that already keeps the
    roster is left as it is)."""
    if registry.on_hosts is not None:
        return
    path = roster_path(app_id, directory)
    hosts = read_roster(path)
    registry.on_hosts = functools.partial(write_roster, path)
    if hosts:
        joined = invite(hosts, registry.endpoint, registry.secret)
        log.info("%d of the %d state hosts on the roster joined", len(joined), len(hosts))
