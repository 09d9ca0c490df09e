"""Latency from ``kubectl apply`` of a CompactionService to its Deployments existing.

It starts the API emulator and the operator (the real ``statetier-operator run``, i.e. kopf) on
127.0.0.1, applies the CRDs, then ``runs`` times applies a fresh CompactionService with kubectl
and polls the emulator until both Deployments exist. The figure includes kubectl's own start-up
and discovery (as a person's ``kubectl apply`` would), and the emulator has no etcd, so it
measures the operator's reaction path, not a real cluster's write latency.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from statetier.kubetest.processes import Sandbox, compaction_service_manifest

__all__ = ["main", "measure"]

REPO = Path(__file__).resolve().parents[4]  # kubetest/src/statetier/kubetest/bench.py


def _exists(base: str, path: str) -> bool:
    try:
        with urllib.request.urlopen(base + path, timeout=5) as response:
            return bool(json.load(response).get("metadata"))
    except OSError:
        return False


def measure(runs: int = 20, timeout: float = 10.0) -> list[float]:
    """Seconds from the start of ``kubectl apply`` to both Deployments existing, per run."""
    samples: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, Sandbox(Path(tmp), webhooks=False) as box:
        box.kubectl("apply", "-f", str(REPO / "crds"))
        box.wait_for_operator()
        for i in range(runs):
            name = f"bench-{i}"
            started = time.perf_counter()
            box.kubectl("apply", "-f", "-", stdin=compaction_service_manifest(name))
            deadline = started + timeout
            paths = [
                f"/apis/apps/v1/namespaces/default/deployments/{name}-{part}"
                for part in ("gateway", "workers")
            ]
            while not all(_exists(box.url, p) for p in paths):
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"{name}: Deployments did not appear in {timeout}s")
                time.sleep(0.005)
            samples.append(time.perf_counter() - started)
    return samples


def main(argv: Sequence[str] | None = None) -> int:
    """``statetier-operator bench``: print every sample and the median; exit 1 if the median
    misses the 1 s target."""
    parser = argparse.ArgumentParser(
        prog="statetier-operator bench",
        description="Latency from kubectl apply of a CompactionService to its Deployments "
        "existing, against the API emulator; exits 1 when the median is 1 s or more.",
    )
    parser.add_argument("--runs", type=int, default=20, help="CompactionServices to apply")
    runs = parser.parse_args(argv).runs
    try:
        samples = measure(runs)
    except (subprocess.CalledProcessError, TimeoutError) as exc:
        print(f"benchmark failed: {exc}")
        return 1
    median = statistics.median(samples)
    print("apply->Deployments seconds:", " ".join(f"{s:.3f}" for s in samples))
    print(
        f"median of {len(samples)}: {median:.3f} s (target < 1 s)"
        f" min {min(samples):.3f} max {max(samples):.3f}"
    )
    return 0 if median < 1.0 else 1
