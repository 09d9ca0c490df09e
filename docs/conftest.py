"""The pages' examples run as doctests; the temp dirs they make (``tempfile.mkdtemp()``, as a
reader would write it) go in the test's own folder, which pytest removes, not in the machine's
temp dir, where every run left three checkpoints."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def temp_dir_of_the_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
