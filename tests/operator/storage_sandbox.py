"""The sandbox of the StateSnapshot and upgrade tests: emulator and operator, with a storage
Secret for SeaweedFS, and the Job double finding ``statetier`` on PATH as the image would."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from statetier.kubetest.processes import Sandbox
from statetier.tools.seaweed import KEY, SECRET

from tests.checkpoint.ckpt_support import S3Server
from tests.operator.conftest import CRDS, SPARK_CRD

STORAGE_SECRET = "store"


@contextmanager
def storage_sandbox(
    workdir: Path, seaweed: S3Server, extra_args: tuple[str, ...] = ()
) -> Iterator[Sandbox]:
    """The CRDs applied, the ``store`` Secret written, the operator running."""
    bin_dir = str(Path(sys.executable).parent)
    sandbox = Sandbox(
        workdir,
        operator=False,
        extra_args=extra_args,
        emulator_env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
    )
    with sandbox:
        sandbox.kubectl("apply", "-f", str(CRDS), "-f", str(SPARK_CRD))
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": STORAGE_SECRET}}
        secret["stringData"] = {
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_ENDPOINT_URL": seaweed.endpoint,
        }
        sandbox.kubectl("apply", "-f", "-", stdin=json.dumps(secret))
        sandbox.start_operator_process()
        sandbox.wait_for_operator()
        yield sandbox
