"""The resolved configuration is typed: its fields follow the schema, and mypy holds code to them.

``StatetierConfig`` declares one field per setting with the type its parser returns. These tests
keep the two in step (a setting without a field, a field without a setting, or a field whose type
is not what the parser gives all fail), and show what the typing buys: ``mypy --strict`` refuses a
misspelled setting name, a value used as the wrong type or a comparison with a choice that does
not exist, and accepts the correct spelling.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import mypy.api
import pytest
from statetier.backend.config import SETTINGS, StatetierConfig, load_config

ROOT = Path(__file__).resolve().parents[2]

NOT_SETTINGS = {"sources"}  # the one field that is not a setting: where each value came from


def test_every_setting_has_a_field_of_its_parsers_type_and_no_field_is_extra() -> None:
    hints = typing.get_type_hints(StatetierConfig)
    fields = {f.name for f in dataclasses.fields(StatetierConfig)} - NOT_SETTINGS
    assert fields == {s.field for s in SETTINGS}
    for setting in SETTINGS:
        parsed = typing.get_type_hints(setting.parser)["return"]
        assert hints[setting.field] == parsed, (setting.name, hints[setting.field], parsed)
        origin = typing.get_origin(parsed) or parsed
        if origin is typing.Literal:  # a choice: the default is one of its values
            assert setting.default in typing.get_args(parsed), setting.name
        else:
            assert isinstance(setting.default, origin), setting.name


def test_fields_hold_the_parsed_values_and_the_mapping_view_agrees() -> None:
    cfg = load_config({"spill.dirs": "/a,/b", "memory.budget": "2g"}, env={})
    assert cfg.spill_dirs == ("/a", "/b") and cfg["spill.dirs"] == ("/a", "/b")
    assert cfg.memory_budget == 2 << 30 and cfg.source("memory.budget") == "code"
    assert list(cfg) == [s.name for s in SETTINGS] and len(cfg) == len(SETTINGS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.spill_ratio = 0.9  # type: ignore[misc]
    with pytest.raises(KeyError):
        cfg["spill.dir"]


GOOD = """
from statetier.backend.config import load_config

cfg = load_config({"spill.dirs": "/ssd"}, env={})
dirs: tuple[str, ...] = cfg.spill_dirs
budget: int = cfg.memory_budget
remote_fails = cfg.compaction_failure_strategy == "fail"
"""

BAD = """
from statetier.backend.config import load_config

cfg = load_config({"spill.dirs": "/ssd"}, env={})
dirs: tuple[str, ...] = cfg.spil_dirs
budget: str = cfg.memory_budget
in_executor = cfg.compaction_mode == "executer"
"""


def test_mypy_strict_refuses_a_misspelled_or_mistyped_setting_or_choice(tmp_path: Path) -> None:
    (tmp_path / "good_use.py").write_text(GOOD)
    (tmp_path / "bad_use.py").write_text(BAD)
    (tmp_path / "mypy.ini").write_text(f"[mypy]\nmypy_path = {ROOT / 'backend' / 'src'}\n")
    out, err, status = mypy.api.run(
        [
            "--strict",
            "--config-file",
            str(tmp_path / "mypy.ini"),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--namespace-packages",
            "--explicit-package-bases",
            "--no-incremental",
            str(tmp_path / "good_use.py"),
            str(tmp_path / "bad_use.py"),
        ]
    )
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert status == 1, out + err
    assert not [line for line in errors if "good_use.py" in line], out
    assert any(
        "bad_use.py:5:" in line and '"StatetierConfig" has no attribute "spil_dirs"' in line
        for line in errors
    ), out
    assert any(
        "bad_use.py:6:" in line and 'expression has type "int", variable has type "str"' in line
        for line in errors
    ), out
    assert any(
        "bad_use.py:7:" in line and "Non-overlapping equality check" in line for line in errors
    ), out
    assert len(errors) == 3, out
