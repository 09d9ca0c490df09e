"""Benchmarks run by ``make bench`` (``statetier bench NAME``).

Each benchmark measures statetier and its peer in the same run on the same input, repeats each
measurement and reports medians and ratios: the machines are shared and noisy, so only figures
taken side by side mean anything.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def median_rate(work: Callable[[], int], repeats: int) -> tuple[float, list[float]]:
    """Median operations per second of ``work`` (which returns its operation count)."""
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        ops = work()
        rates.append(ops / (time.perf_counter() - started))
    return statistics.median(rates), rates


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    print(title)
    for row in [header, *rows]:
        print(
            "  "
            + "  ".join(str(cell).rjust(width) for cell, width in zip(row, widths, strict=True))
        )


def run_child(command: list[str], what: str) -> tuple[dict[str, Any], str]:
    """Run a benchmark's child process; its report (the JSON object on its last line of output)
    and its stderr. A child that fails raises with ``what`` and its stderr."""
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result, done.stderr


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (from /proc: another process's
    CPU, e.g. a compaction worker's or a state host's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
