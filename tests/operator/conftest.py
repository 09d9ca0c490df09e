"""Shared fixtures: a running emulator + operator (+ webhook server) on 127.0.0.1.

One sandbox per test module keeps the suite fast (kopf starts in about a second); each test
uses its own object names so tests in a module do not see each other's objects.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from statetier.kubetest.processes import Sandbox, free_port

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "crds"
SPARK_CRD = Path(__file__).parent / "fixtures" / "sparkapplication-crd.yaml"
EXAMPLES = REPO / "examples"


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """Emulator, CRDs applied with kubectl, then the real operator with its webhooks."""
    workdir = tmp_path_factory.mktemp("sandbox")
    # An object store that refuses connections, for the "never blocks deletion" test; the short
    # timeout bounds how long a finalizer may try.
    closed = free_port()
    box = Sandbox(
        workdir,
        operator=False,
        extra_args=("--checkpoint-delete-timeout", "3"),
        env={
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{closed}",
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_EC2_METADATA_DISABLED": "true",
        },
    )
    with box:
        box.kubectl("apply", "-f", str(CRDS), "-f", str(SPARK_CRD))
        box.start_operator_process()
        box.wait_for_operator()
        yield box
