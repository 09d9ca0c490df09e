"""Render the statetier chart to plain manifests without a helm binary (helm-python-sdk).

    python charts/render.py > statetier.yaml                       # default values
    python charts/render.py -f my-values.yaml -n statetier > statetier.yaml
    kubectl create namespace statetier && kubectl apply -f statetier.yaml

The values are validated against values.schema.json first; an invalid value is an error that
names the key. ``make manifests`` writes dist/statetier.yaml this way.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import helm_python
import yaml

CHART = Path(__file__).resolve().parent / "statetier"
# Helm's Go code logs to the process's stderr with Go's default logger, below Python's logging
# (helm_python.enable_logging does not reach it): "2026/01/02 03:04:05 INFO found symbolic link".
GO_INFO = re.compile(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d (?:INFO|DEBUG) ")


@contextlib.contextmanager
def quiet_go_info() -> Iterator[None]:
    """Hold file descriptor 2 while Helm's Go code runs; pass on what it wrote except Go's
    INFO and DEBUG lines, which say nothing a user of the rendered manifests needs."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            for line in held.read().decode(errors="replace").splitlines(keepends=True):
                if not GO_INFO.match(line):
                    sys.stderr.write(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-f", "--values", action="append", default=[], help="values file")
    parser.add_argument("-n", "--namespace", default="statetier")
    parser.add_argument("--name", default="statetier", help="release name")
    args = parser.parse_args(argv)
    values: dict[str, object] = {}
    for path in args.values:
        values = _merge(values, yaml.safe_load(Path(path).read_text()) or {})
    with quiet_go_info(), helm_python.Chart.load(str(CHART)) as chart:
        try:
            rendered = chart.render(values, name=args.name, namespace=args.namespace)
        except helm_python.HelmValuesError as exc:
            invalid = exc
        else:
            invalid = None
    if invalid is not None:
        print(f"invalid values: {invalid}", file=sys.stderr)
        return 2
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt") or not text.strip():
            continue
        sys.stdout.write(f"---\n# Source: {path}\n{text.strip()}\n")
    return 0


def _merge(base: dict[str, object], override: dict[str, object]) -> dict[str, object]:
    out = dict(base)
    for key, value in override.items():
        current = out.get(key)
        if isinstance(current, dict) and isinstance(value, dict):
            out[key] = _merge(current, value)
        else:
            out[key] = value
    return out


if __name__ == "__main__":
    sys.exit(main())
