"""The suite's order: each xdist worker's share of the tests begins with its share of the slow ones.

``make test`` runs ``--dist worksteal``: xdist hands each worker one contiguous block of the
collection, and a worker that runs out steals the end of another's queue. The slow tests (Spark
clusters, demos, chaos: one to six minutes each) are collected late, under ``tests/spark``, so
in collection order they all fell into the last block: one worker ran them one after another
while the others idled (the suite's last ten minutes). Dealt out so that every block starts with
its part of them, they run beside each other and beside the many short tests, and what is left
to steal at the end is short. The short tests stay in contiguous runs, so that a module's tests
mostly share one worker's module-scoped fixtures (an emulator and operator each).
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    short = [item for item in items if item.get_closest_marker("slow") is None]
    cuts = [len(short) * block // workers for block in range(workers + 1)]
    items[:] = [
        item
        for block in range(workers)
        for item in slow[block::workers] + short[cuts[block] : cuts[block + 1]]
    ]
