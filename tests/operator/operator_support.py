"""Paths shared by the operator tests (a plain module: tests/operator has no __init__.py,
which would make it a package named ``operator`` and shadow the standard library)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "crds"
SPARK_CRD = Path(__file__).parent / "fixtures" / "sparkapplication-crd.yaml"
EXAMPLES = REPO / "examples"
