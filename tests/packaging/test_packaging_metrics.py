"""Dashboards and alert rules use only metric names the running code exports.

The operator (run with the chart's arguments through the integration flow, webhooks called),
a compaction gateway with a worker heartbeating into it, and a backend process running the word
count with the spill tier and a checkpoint per epoch are started for real on 127.0.0.1 and
scraped. Every metric name in every PromQL expression of charts/statetier/dashboards/*.json and
charts/statetier/rules/*.yaml must be among the scraped names.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from statetier.kubetest.processes import free_port
from statetier.tools.compaction_launch import Processes

from tests.packaging.packaging_support import CHART, FlowResult

DASHBOARDS = sorted((CHART / "dashboards").glob("*.json"))
RULES = CHART / "rules" / "statetier-alerts.yaml"
BACKEND_PROCESS = Path(__file__).parent / "backend_metrics_process.py"

KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
    "and", "or", "unless", "inf", "nan",
    # aggregation operators, which may be followed by `by (...)` rather than `(`
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "limitk", "limit_ratio",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords,
    label names (in ``{}`` or after by/without/on/ignoring/group_*), strings, durations or
    Grafana variables."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    text = re.sub(r"\$\{?\w+\}?", "", text)  # Grafana variables
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(r"(?<![\w:])\d[\w.]*", "", text)  # numbers and durations (offset 5m)
    text = re.sub(
        r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", text
    )  # grouping labels
    names = set()
    for match in re.finditer(r"[A-Za-z_:][\w:]*", text):
        token = match.group()
        rest = text[match.end() :].lstrip()
        if token.lower() in KEYWORDS or rest.startswith("("):
            continue
        names.add(token)
    return names


def test_the_name_extraction_itself() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, resource) (rate(a_bucket{x="y", z=~"$v"}[5m])))'
        " / on(pod) group_left(node) b_total and time() - c > 0 unless d offset 5m"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c", "d"}
    assert metric_names("absent(up)") == {"up"}


def expressions() -> list[tuple[str, str]]:
    """(where, PromQL) of every dashboard target, variable query and alert rule."""
    out = []
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                out.append((f"{path.name}: {panel['title']}", target["expr"]))
        for var in dashboard["templating"]["list"]:
            if var["type"] == "query":
                query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
                inner = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
                assert inner, f"{path.name}: variable {var['name']}: {query}"
                out.append((f"{path.name}: variable {var['name']}", inner.group(1)))
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            out.append((f"{RULES.name}: {rule['alert']}", rule["expr"]))
    return out


def exported(text: str) -> set[str]:
    """Names a scrape exports: sample names, and declared families (with their suffixes) even
    before a labelled child exists."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(sample.name for sample in family.samples)
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names.update(family.name + s for s in ("_bucket", "_sum", "_count"))
        else:
            names.add(family.name)
    return names


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def _wait(what: str, predicate: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def compaction_scrape(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real gateway with a real worker heartbeating into it."""
    workdir = tmp_path_factory.mktemp("compaction")
    prefix = f"file://{workdir}/checkpoints/"
    with Processes(workdir) as procs:
        url, _ = procs.gateway([prefix])
        procs.worker(url, [prefix])

        def one_worker_alive() -> str | None:
            text = _scrape(url + "/metrics")
            return text if "statetier_compaction_workers_alive 1.0" in text else None

        yield _wait("the worker's heartbeat in the gateway's metrics", one_worker_alive)


def _backend(workdir: Path, *extra: str) -> Generator[str, None, None]:
    port = free_port()
    with open(workdir / "backend.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(BACKEND_PROCESS), str(port), str(workdir), *extra],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line == "ready", (workdir / "backend.log").read_text()[-3000:]
        yield _scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def backend_scrape(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _backend(tmp_path_factory.mktemp("backend"))


def test_backend_without_spill_tier_still_exports_checkpoint_metrics(tmp_path: Path) -> None:
    process = _backend(tmp_path, "nospill")
    try:
        text = next(process)
    finally:
        process.close()  # stops it
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert samples[("statetier_checkpoints_total", (("outcome", "committed"),))] == 4


def test_every_expression_uses_only_exported_names(
    clusterwide_flow: FlowResult, compaction_scrape: str, backend_scrape: str
) -> None:
    sources = {
        "operator": exported(clusterwide_flow.metrics),
        "compaction gateway": exported(compaction_scrape),
        "backend": exported(backend_scrape),
    }
    known = set().union(*sources.values())
    exprs = expressions()
    assert len(exprs) > 30
    missing = {
        (where, name) for where, expr in exprs for name in metric_names(expr) if name not in known
    }
    assert not missing, f"names no running component exports: {sorted(missing)}"
    used = {name for _, expr in exprs for name in metric_names(expr)}
    # Each component's dashboard reads what that component exports.
    for component, prefix in (
        ("operator", "statetier_operator_"),
        ("compaction gateway", "statetier_compaction_queue_depth"),
        ("backend", "statetier_state_heap_bytes"),
    ):
        assert any(n.startswith(prefix) for n in sources[component] & used), component


def test_the_backend_really_fed_its_series(backend_scrape: str) -> None:
    """Checkpoints committed and key groups spilled in the backend process: the series the
    dashboards plot carry values, not only declarations."""
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(backend_scrape)
        for s in f.samples
    }
    assert samples[("statetier_checkpoints_total", (("outcome", "committed"),))] == 4
    assert samples[("statetier_checkpoint_last_success_timestamp_seconds", ())] > 0
    assert samples[("statetier_checkpoint_size_bytes_sum", ())] > 0
    assert sum(v for (n, _), v in samples.items() if n == "statetier_key_group_spills_total") > 0
    free = [v for (n, _), v in samples.items() if n == "statetier_spill_volume_free_bytes"]
    capacity = [v for (n, _), v in samples.items() if n == "statetier_spill_volume_capacity_bytes"]
    assert free and capacity and 0 < free[0] <= capacity[0]


def test_every_panel_has_title_unit_and_description() -> None:
    assert [p.name for p in DASHBOARDS] == [
        "statetier-compaction.json",
        "statetier-operator.json",
        "statetier-state.json",
    ]
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        assert dashboard["uid"] and dashboard["title"]
        ids = [p["id"] for p in dashboard["panels"]]
        assert len(ids) == len(set(ids)), path.name
        for panel in dashboard["panels"]:
            where = f"{path.name}: panel {panel['id']}"
            assert panel.get("title"), where
            assert len(panel.get("description", "")) > 20, where
            assert panel["fieldConfig"]["defaults"].get("unit"), where
            assert panel["targets"], where
