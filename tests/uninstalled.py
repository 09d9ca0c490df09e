"""Run a command of this environment as if one distribution were not installed.

The new interpreter starts without site-packages (``-I -S``) and adds a view of it instead: a
directory of links to every entry but the distribution's own (its ``.dist-info`` and the
``.pth`` file of its editable install). Python then neither imports its package nor finds its
metadata or entry points, as after ``pip uninstall``, and the environment stays as it is.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

__all__ = ["run_without"]

# The new interpreter: site-packages through the view, then the command's main.
BOOT = (
    "import importlib, site, sys; site.addsitedir(sys.argv[1]); "
    "module = importlib.import_module(sys.argv[2]); sys.exit(module.main(sys.argv[3:]))"
)


def run_without(
    distribution: str, view: Path, module: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """``module.main(args)`` in an interpreter that lacks ``distribution`` (e.g.
    ``statetier-tools``); ``view`` is a new directory for the links."""
    hidden = distribution.replace("-", "_")
    view.mkdir()
    for directory in {Path(sysconfig.get_paths()[key]) for key in ("purelib", "platlib")}:
        for entry in directory.iterdir():
            if hidden not in entry.name and not (view / entry.name).exists():
                (view / entry.name).symlink_to(entry)
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", BOOT, str(view), module, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
