"""What users read says nothing about the machines or the planning it was written with: no
absolute paths of a development machine, no "issue 7", "TODO" or work-session remarks, in
docs/, the README or any ``statetier`` help text."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
from statetier.backend import cli
from statetier.tools import commands

REPO = Path(__file__).resolve().parents[1]
PAGES = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]

MACHINE_PATHS = [
    re.escape(str(REPO)),
    r"(?<![\w.-])/(?:work|root|home)/\S+",
    r"(?<![\w.-])/tmp/(?:pytest-of-|tmp|bash_jobs)\S*",
    r"(?<![\w.-])/opt/pypi\S*",
]
PLANNING = [
    r"\bissues?\s*#?\d+",
    r"\(issue\b",
    r"\bin (?:its|their) own issues?\b",
    r"\bTODO\b",
    r"\bFIXME\b",
    r"\b(?:this|that|next|later|previous|earlier|per|work) session\b",
    r"\bother engineers\b",
    r"\bdevelopment machines?\b",
]


def problems(text: str) -> list[str]:
    """Each machine path or planning word in ``text``, with its line."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern in MACHINE_PATHS + PLANNING:
            match = re.search(pattern, line, re.IGNORECASE if pattern in PLANNING else 0)
            if match:
                found.append(f"line {number}: {match.group(0)!r} in {line.strip()[:120]!r}")
    return found


def help_text(*args: str) -> str:
    """``statetier ARGS --help`` as printed, run in this process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        cli.main([*args, "--help"])
    assert exited.value.code == 0, args
    return out.getvalue()


HELP = [
    (),
    ("demo",),
    ("demo", "--local"),
    ("bench",),
    *[("bench", name) for name in commands.BENCHMARKS],
    ("checkpoint",),
    *[
        ("checkpoint", action)
        for action in (
            "list",
            "inspect",
            "verify",
            "gc",
            "savepoint",
            "delete-savepoint",
            "restore-spark",
        )
    ],
    ("config",),
    ("config", "docs"),
    ("config", "show"),
]


def test_the_checker_finds_what_it_should() -> None:
    assert problems(f"see {REPO}/docs")
    assert problems("in `/work/shared/seeds`")
    assert problems("Target (issue 7): ratio")
    assert problems("the Spark pipeline replaces it in its own issue")
    assert problems("TODO: later")
    assert problems("figures on the development machines")
    assert not problems("a SparkSession; a session window per user; /tmp is an emptyDir")
    assert not problems("mounted at /var/lib/statetier/spill")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_pages_have_no_machine_paths_or_planning_words(page: Path) -> None:
    assert problems(page.read_text()) == [], page.name


@pytest.mark.parametrize("args", HELP, ids=lambda a: " ".join(a) or "statetier")
def test_help_is_plain_words_for_users(args: tuple[str, ...]) -> None:
    text = help_text(*args)
    assert problems(text) == []
    assert "``" not in text and ":class:" not in text, text  # no reST markup
