"""The demos' working directory: a demo deletes only what it created itself.

A fresh run starts from an empty directory. It may empty one only when a marker file says that
this same demo made it; a directory with anything else in it (a user's files, the other demo's
state) is refused with a message, never deleted. ``--restart`` needs the marker of its own demo.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from statetier.tools.demo.shell import statetier_program

__all__ = ["MARKER", "DemoDirError", "prepare"]

MARKER = ".statetier-demo"


class DemoDirError(ValueError):
    """The directory cannot be used by this demo (it is not ours, or there is nothing to resume)."""


def owner(directory: Path) -> str | None:
    """Which demo made ``directory`` (the marker's content), or None."""
    marker = directory / MARKER
    return marker.read_text().strip() if marker.is_file() else None


def prepare(directory: Path, kind: str, *, restart: bool) -> Path:
    """``directory`` ready for a run of the demo ``kind``; raises DemoDirError when not ours."""
    directory = directory.resolve()
    made_by = owner(directory) if directory.is_dir() else None
    if restart:
        if made_by != kind:
            raise DemoDirError(
                f"nothing to restart in {directory}: it holds no state of `{command(kind)}`; "
                "run it once without --restart"
            )
        return directory
    if directory.exists() and not directory.is_dir():
        raise DemoDirError(f"{directory} is a file; give --dir a directory")
    if made_by is not None and made_by != kind:
        raise DemoDirError(
            f"{directory} holds the state of `{command(made_by)}`; choose another --dir"
        )
    if made_by is None and directory.is_dir() and any(directory.iterdir()):
        raise DemoDirError(
            f"{directory} is not empty and was not made by this demo; "
            "choose another --dir (nothing was deleted)"
        )
    if made_by == kind:
        shutil.rmtree(directory)  # our own earlier run: start again from nothing
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MARKER).write_text(kind + "\n")
    return directory


def command(kind: str) -> str:
    """The command line of the demo ``kind`` (``spark`` or ``local``)."""
    demo = f"{statetier_program()} demo"
    return f"{demo} --local" if kind == "local" else demo
