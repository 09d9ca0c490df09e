"""The values table of the chart README, generated from values.schema.json and values.yaml.

    python charts/values_table.py           # rewrite the table in charts/statetier/README.md
    python charts/values_table.py --check   # exit 1, naming the file, if it is out of date

One row per leaf value (a key whose default is not an object with its own schema): its dotted
key, type, default (from values.yaml) and description (from the schema), so the table can never
disagree with what helm validates. tests/packaging/test_packaging_chart.py runs ``--check``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parent / "statetier"
README = CHART / "README.md"
START, END = "<!-- values-table:start -->", "<!-- values-table:end -->"


def _type(node: dict[str, Any]) -> str:
    kind = node.get("type", "any")
    return " or ".join(kind) if isinstance(kind, list) else str(kind)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def rows(schema: dict[str, Any], values: Any, prefix: str = "") -> list[str]:
    """Markdown rows for every leaf under ``schema`` (depth first, in schema order)."""
    out = []
    for key, node in (schema.get("properties") or {}).items():
        default = values.get(key) if isinstance(values, dict) else None
        path = f"{prefix}{key}"
        if node.get("properties") and isinstance(default, dict):
            out += rows(node, default, f"{path}.")
            continue
        shown = json.dumps(default) if default is not None else ""
        description = node.get("description", "")
        out.append(f"| `{path}` | {_type(node)} | `{_cell(shown)}` | {_cell(description)} |")
    return out


def table() -> str:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    header = ["| key | type | default | description |", "|---|---|---|---|"]
    return "\n".join(header + rows(schema, values))


def rendered(readme: str) -> str:
    """``readme`` with the table between the markers replaced by the generated one."""
    if START not in readme or END not in readme:
        raise ValueError(f"{README}: the markers {START} and {END} are missing")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether it is current")
    args = parser.parse_args(argv)
    current = README.read_text()
    try:
        wanted = rendered(current)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if wanted != current:
            print(
                f"error: {README} has an outdated values table; run python charts/values_table.py",
                file=sys.stderr,
            )
            return 1
        return 0
    README.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
