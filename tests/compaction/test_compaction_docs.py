"""docs/compaction.md names every gateway metric, and a real gateway exports every one."""

from __future__ import annotations

import urllib.request
from pathlib import Path

from statetier.compaction.cli import build_parser
from statetier.compaction.metrics import DOCUMENTED
from statetier.tools.compaction_launch import Processes

DOC = Path(__file__).resolve().parents[2] / "docs" / "compaction.md"


def test_docs_list_every_gateway_metric() -> None:
    text = DOC.read_text()
    for name in DOCUMENTED:
        assert f"`{name}`" in text, f"{name} missing from docs/compaction.md"


def test_the_gateway_exports_every_documented_metric(procs: Processes, prefix: str) -> None:
    gateway, _ = procs.gateway([prefix])
    with urllib.request.urlopen(f"{gateway}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    samples = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}
    # a series labelled by tenant has no sample before a tenant's first job: its type is there
    typed = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    for name in DOCUMENTED:
        found = samples | {f"{t}_total" for t in typed} | typed
        assert any(s == name or s.startswith(name + "_") for s in found), name
    assert all(s.startswith("statetier_compaction_") for s in samples | typed)


def test_docs_list_every_gateway_limit_and_the_sandbox_flag() -> None:
    text = DOC.read_text()
    gateway = next(
        action
        for action in build_parser()._subparsers._group_actions[0].choices.values()  # type: ignore[union-attr]
        if action.prog.endswith("gateway")
    )
    flags = [
        option
        for action in gateway._actions
        for option in action.option_strings
        if option.startswith("--max-") or option.endswith("-timeout") or "insecure" in option
    ]
    assert len(flags) >= 12
    for flag in flags:
        assert f"`{flag}`" in text, f"{flag} missing from docs/compaction.md"
