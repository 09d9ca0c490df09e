"""The operator keeps no process-wide state of its own: settings, its API client and shared
locks are in kopf's memo, what handlers look up about other objects in kopf indexes.

A ``global`` statement or a module-level mutable container (a dict, list or set bound to a
lower-case name) in a module of the operator or the compaction service fails this test;
constants are upper case and immutable. Both packages hold runtime code only (the Kubernetes test
environment is the kubetest distribution, the launchers and benchmarks are in tools), so every
module is checked.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODULES = sorted(
    path
    for root in ("operator/src/statetier/operator", "compaction/src/statetier/compaction")
    for path in (REPO / root).glob("*.py")
)
MUTABLE = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "WeakValueDictionary"}


def _hidden_state(tree: ast.Module) -> list[str]:
    found = [f"line {n.lineno}: global" for n in ast.walk(tree) if isinstance(n, ast.Global)]
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        call = isinstance(value, ast.Call) and getattr(value.func, "id", None) in MUTABLE_CALLS
        for target in targets:
            name = getattr(target, "id", "")
            constant = name.isupper() or name == "__all__"
            if name and not constant and (isinstance(value, MUTABLE) or call):
                found.append(f"line {node.lineno}: {name}")
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_module_level_mutable_state(path: Path) -> None:
    assert _hidden_state(ast.parse(path.read_text())) == []


def test_the_check_finds_a_global_and_a_module_level_registry() -> None:
    source = "_clients: dict[str, int] = {}\nseen = set()\ndef f():\n    global seen\n"
    assert _hidden_state(ast.parse(source)) == [
        "line 4: global",
        "line 1: _clients",
        "line 2: seen",
    ]
