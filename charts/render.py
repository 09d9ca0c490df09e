"""Render the statetier chart to plain manifests without a helm binary (helm-python-sdk).

    python charts/render.py > statetier.yaml                       # default values
    python charts/render.py -f my-values.yaml -n statetier > statetier.yaml
    kubectl create namespace statetier && kubectl apply -f statetier.yaml

The values are validated against values.schema.json first; an invalid value is an error that
names the key. ``make manifests`` writes dist/statetier.yaml this way.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import helm_python
import yaml

CHART = Path(__file__).resolve().parent / "statetier"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-f", "--values", action="append", default=[], help="values file")
    parser.add_argument("-n", "--namespace", default="statetier")
    parser.add_argument("--name", default="statetier", help="release name")
    args = parser.parse_args(argv)
    values: dict[str, object] = {}
    for path in args.values:
        values = _merge(values, yaml.safe_load(Path(path).read_text()) or {})
    with helm_python.Chart.load(str(CHART)) as chart:
        try:
            rendered = chart.render(values, name=args.name, namespace=args.namespace)
        except helm_python.HelmValuesError as exc:
            print(f"invalid values: {exc}", file=sys.stderr)
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
