"""What memory this process holds (its anonymous RSS) and may hold (its budget): a module of its
own at the bottom of the backend, because the spill tier's monitor is not the only reader: a
Spark task reads the budget to split it between its executor's state hosts, and a host reports
its RSS to the driver, and neither should load the spill tier for it.

The budget is ``memory.budget`` if set, else the container's limit (cgroup v2 ``memory.max``,
cgroup v1 ``memory.limit_in_bytes``; "max" or the v1 "unlimited" value mean none), else the
machine's physical memory.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["read_rss", "resolve_budget"]

_V1_UNLIMITED = 1 << 60  # cgroup v1 reports "no limit" as about 2**63 rounded to pages


def read_rss() -> int:
    """Anonymous resident memory of this process in bytes (``RssAnon``, Linux).

    Not the whole RSS: pages of the mmap'd spill chunks count in RSS as file pages, but they are
    page cache the kernel can write back and drop, not heap; counting them would make every
    spilled byte look like heap pressure and spill everything.
    """
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def resolve_budget(configured: int, cgroup_root: str = "/sys/fs/cgroup") -> tuple[int, str]:
    """The memory budget in bytes and where it came from."""
    if configured > 0:
        return configured, "memory.budget"
    root = Path(cgroup_root)
    try:
        text = (root / "memory.max").read_text().strip()
        if text != "max":
            return int(text), "cgroup v2 memory.max"
    except (OSError, ValueError):
        pass
    try:
        limit = int((root / "memory" / "memory.limit_in_bytes").read_text().strip())
        if 0 < limit < _V1_UNLIMITED:
            return limit, "cgroup v1 memory.limit_in_bytes"
    except (OSError, ValueError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "physical memory"
