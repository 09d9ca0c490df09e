"""Command help from docstrings, in plain words.

The module docstrings that describe commands are written for the source (reST roles, double
backquotes); ``--help`` shows them without that markup.
"""

from __future__ import annotations

import re

__all__ = ["plain"]

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def plain(doc: str | None) -> str:
    """``doc`` without reST markup: ``:class:`X``` and ````x```` become ``X`` and ``x``."""
    text = _ROLE.sub(r"\1", doc or "")
    return text.replace("``", "")
