"""How the commands a demo prints name ``statetier``, so that they run as printed.

``make install`` puts ``statetier`` in ``.venv/bin``, which a fresh shell's ``PATH`` does not
hold: a printed ``statetier demo --restart`` would then fail with "command not found". The
demos print the program's path instead, unless ``statetier`` is on the ``PATH`` of every shell
(installed outside a virtual environment).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

__all__ = ["statetier_program"]


def statetier_program() -> str:
    """``statetier`` when a fresh shell finds this installation's command by that name, else
    the command's path: relative to the current directory when it is under it
    (``.venv/bin/statetier``), else absolute."""
    installed = Path(sys.executable).parent / "statetier"
    if not installed.exists():
        return "statetier"
    on_path = shutil.which("statetier")
    activated = os.environ.get("VIRTUAL_ENV")  # its PATH entry is this shell's alone
    if on_path and Path(on_path).resolve() == installed.resolve() and not activated:
        return "statetier"
    try:
        return str(installed.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(installed.absolute())
