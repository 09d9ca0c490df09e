"""The public API is declared, and what users read uses nothing else.

Three modules are public: ``statetier.backend`` (functions, their context, state, TTL, the local
runner, configuration, serializers), ``statetier.backend.spark`` (the pipeline) and
``statetier.backend.testing`` (the clock and the function harness). Their ``__all__`` is the
public surface, held here to the reviewed list. Every Python snippet of the README and docs/, and
every program under examples/, imports statetier names only from there: the checker below parses
each one (doctest prompts stripped) and names every import outside the surface.
"""

from __future__ import annotations

import ast
import doctest
import importlib
import re
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest

REPO = Path(__file__).resolve().parents[1]

PUBLIC: dict[str, set[str]] = {
    "statetier.backend": {
        # functions and their context
        "KeyedProcessFunction",
        "RuntimeContext",
        "TimerService",
        "TimeDomain",
        "CheckpointListener",
        "CheckpointedFunction",
        "FunctionInitializationContext",
        "FunctionSnapshotContext",
        "AggregateFunction",
        # state: descriptors, handles, the errors its use raises
        "StateDescriptor",
        "ValueStateDescriptor",
        "ListStateDescriptor",
        "ReducingStateDescriptor",
        "AggregatingStateDescriptor",
        "MapStateDescriptor",
        "State",
        "ValueState",
        "ListState",
        "ReducingState",
        "AggregatingState",
        "MapState",
        "KeyBatch",
        "StateRegistrationError",
        "NoCurrentKeyError",
        "NullKeyError",
        # time to live
        "StateTtlConfig",
        "UpdateType",
        "StateVisibility",
        "TtlMismatchError",
        # serializers
        "Serializer",
        "register_serializer",
        "MsgpackSerializer",
        "PickleSerializer",
        "RawBytesSerializer",
        "SerializationError",
        # typed state values (docs/evolving-state.md)
        "TypedSerializer",
        "ValueType",
        "SchemaField",
        "record_type",
        # running and configuring
        "LocalRunner",
        "load_config",
        "StatetierConfig",
        "ConfigError",
    },
    "statetier.backend.spark": {
        "StatefulPipeline",
        "EpochReport",
        "KeyGroupFunction",
        "Combiner",
        "KEY_GROUP_COLUMN",
        "SparkTask",
        "current_task",
        "register_data_sources",
        "write_state",
    },
    "statetier.backend.testing": {"FunctionHarness", "ManualClock"},
}

FENCE = re.compile(r"^```(?:python|py)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def import_problems(source: str) -> list[str]:
    """Each import in ``source`` of a statetier module or name outside the public surface."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("statetier") and alias.name not in PUBLIC:
                    found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("statetier"):
            module = node.module or ""
            for alias in node.names:
                if f"{module}.{alias.name}" in PUBLIC:
                    continue  # a public module, e.g. `from statetier.backend import testing`
                if alias.name not in PUBLIC.get(module, set()):
                    found.append(f"line {node.lineno}: from {module} import {alias.name}")
    return found


def snippets(page: Path) -> list[str]:
    """The Python of a page: a .py file whole; of Markdown, every doctest example and every
    ```python block without prompts."""
    text = page.read_text()
    if page.suffix == ".py":
        return [text]
    found = [example.source for example in doctest.DocTestParser().get_examples(text)]
    found += [block for block in FENCE.findall(text) if ">>>" not in block]
    return found


PAGES = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted((REPO / "examples").rglob("*.py")),
]


def test_the_checker_finds_internal_imports() -> None:
    assert import_problems("from statetier.backend import KeyedStateBackend, LocalRunner") == [
        "line 1: from statetier.backend import KeyedStateBackend"
    ]
    assert import_problems("from statetier.backend.local_runner import LocalRunner")
    assert import_problems("import statetier.backend.keyed_backend as kb")
    assert import_problems("from statetier.backend.spark import KeyedProcessFunction")
    assert import_problems("from statetier.compaction import gateway")
    assert import_problems("def f():\n    from statetier.backend import config\n")
    assert not import_problems(
        "import statetier.backend.spark\n"
        "from statetier.backend import LocalRunner, ValueStateDescriptor, testing\n"
        "from statetier.backend.testing import FunctionHarness\n"
        "import pyarrow as pa\n"
    )


def test_snippets_are_found_in_markdown(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Text.\n\n```python\n>>> from statetier.backend.keygroups import KeyGroupRange\n\n```\n\n"
        "```python\nfrom statetier.backend.runtime import FunctionInstance\n```\n\n"
        "```sh\npython -m statetier.backend\n```\n"
    )
    problems = [p for source in snippets(page) for p in import_problems(source)]
    assert problems == [
        "line 1: from statetier.backend.keygroups import KeyGroupRange",
        "line 1: from statetier.backend.runtime import FunctionInstance",
    ]


def test_pages_are_found() -> None:
    assert len(PAGES) > 10
    assert sum(len(snippets(page)) for page in PAGES if page.suffix == ".md") > 20


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_users_import_only_the_public_api(page: Path) -> None:
    problems = [p for source in snippets(page) for p in import_problems(source)]
    assert problems == [], f"{page.relative_to(REPO)} imports internals: {problems}"


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_modules_export_the_declared_surface(module: str) -> None:
    imported = importlib.import_module(module)
    assert set(imported.__all__) == PUBLIC[module]
    for name in imported.__all__:
        assert getattr(imported, name) is not None, name


def test_the_backend_exports_no_internals() -> None:
    """What the package used to re-export stays reachable by its module path only."""
    import statetier.backend

    for internal in ("KeyedStateBackend", "KeyGroupRange", "OperatorStateBackend", "SystemClock"):
        with pytest.raises(AttributeError):
            getattr(statetier.backend, internal)


def test_the_readme_first_example_runs() -> None:
    """The README's plain Python block (not a doctest, so not run by the doctest plugin)."""
    (block,) = FENCE.findall((REPO / "README.md").read_text())
    memory = fsspec.filesystem("memory")
    for _ in range(2):  # from an empty checkpoint location each time, as a reader runs it
        if memory.exists("/readme"):
            memory.rm("/readme", recursive=True)
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})


def test_the_settings_schema_loads_without_the_checkpoint_tier() -> None:
    """The operator imports statetier.backend.config, hence the package: LocalRunner (and with
    it fsspec and the snapshot modules) is loaded on first use only."""
    code = (
        "import sys, statetier.backend.config\n"
        "print(sorted(m for m in ('statetier.backend.local_runner', 'statetier.backend.snapshot',"
        " 'fsspec') if m in sys.modules))\n"
        "from statetier.backend import LocalRunner\n"
        "print(LocalRunner.__module__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.splitlines() == ["[]", "statetier.backend.local_runner"]


def test_a_spark_task_loads_neither_the_spill_tier_nor_the_checkpoint_codecs() -> None:
    """Every new Python worker of an executor imports the task module (on Spark Connect, every
    streaming query starts new ones): it carries chain updates and reads the memory budget, and
    loaded the whole spill and snapshot packages for them (0.3 s of a first micro-batch)."""
    heavy = (
        "statetier.backend.spill",
        "statetier.backend.snapshot.format",
        "statetier.backend.snapshot.store",
        "statetier.backend.snapshot.compaction",
        "fsspec",
        "zstandard",
        "prometheus_client",
    )
    code = (
        "import sys, statetier.backend.spark.task\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))\n"
        "from statetier.backend.snapshot import SnapshotStore, CorruptFileError\n"
        "print(SnapshotStore.__module__, CorruptFileError.__module__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.splitlines() == [
        "[]",
        "statetier.backend.snapshot.store statetier.backend.snapshot.versions",
    ]


def test_the_snapshot_package_loads_each_name_from_its_module() -> None:
    """The package is lazy (a Spark task imports light modules of it only): each of its names
    is its module's own object, and a name it does not have is an AttributeError."""
    import importlib

    from statetier.backend import snapshot

    for name in snapshot.__all__:
        found = getattr(snapshot, name)
        home = importlib.import_module(found.__module__)
        assert getattr(home, name) is found, name
    with pytest.raises(AttributeError, match="has no attribute 'Nothing'"):
        snapshot.Nothing  # noqa: B018
