"""``statetier pyspark-bytecode``: a zip with bytecode imports without compiling, as it did before
in every other respect (sources kept, an edited source or another Python's bytecode ignored)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from statetier.backend import cli
from statetier.backend.pyspark_bytecode import (
    ZIP_IN_SPARK_HOME,
    BytecodeError,
    add_bytecode,
    current_bytecode,
    find_zip,
    pyc,
)

SOURCES = {
    "pkg/__init__.py": b"from pkg.mod import answer\n",
    "pkg/mod.py": b"def answer():\r\n    return 42\r\n",  # CRLF, as the importer normalizes
    "pkg/data.txt": b"not a module\n",
}

# Imports pkg from the zip on sys.path[0] and prints what it answers and how many sources
# Python compiled from inside the zip (the "compile" audit event carries the file name; it is
# raised more than once per compilation).
PROBE = """
import json, sys
compiled = set()
zip_path = sys.argv[1]
sys.addaudithook(lambda event, args: event == "compile" and str(args[1]).startswith(zip_path)
                 and compiled.add(args[1]))
sys.path.insert(0, zip_path)
import pkg
print(json.dumps({"answer": pkg.answer(), "compiled": len(compiled)}))
"""


def spark_home(tmp_path: Path, sources: dict[str, bytes] = SOURCES) -> Path:
    """A Spark home whose pyspark.zip holds ``sources`` (a package ``pkg`` by default)."""
    path = tmp_path / "spark" / ZIP_IN_SPARK_HOME
    path.parent.mkdir(parents=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in sources.items():
            archive.writestr(name, data)
    return tmp_path / "spark"


def probe(zip_path: Path) -> dict[str, int]:
    """What importing ``pkg`` from the zip answers, and how many modules it compiled."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(zip_path)], capture_output=True, check=True, env=env
    )
    result: dict[str, int] = json.loads(out.stdout)
    return result


def rewrite(path: Path, name: str, data: bytes) -> None:
    """The zip at ``path`` with entry ``name`` replaced by ``data`` (the others kept)."""
    with zipfile.ZipFile(path) as old:
        entries = [(e, old.read(e)) for e in old.infolist() if e.filename != name]
    with zipfile.ZipFile(path, "w") as new:
        for entry, content in entries:
            new.writestr(entry, content)
        new.writestr(name, data)


def test_a_zip_with_bytecode_imports_without_compiling(tmp_path: Path) -> None:
    path = find_zip(str(spark_home(tmp_path)))
    assert probe(path) == {"answer": 42, "compiled": 2}
    done = add_bytecode(path)
    assert (done.modules, done.compiled) == (2, 2)
    assert probe(path) == {"answer": 42, "compiled": 0}


def test_the_zips_entries_are_kept_and_a_second_run_adds_no_duplicates(tmp_path: Path) -> None:
    path = find_zip(str(spark_home(tmp_path)))
    with zipfile.ZipFile(path) as before:
        kept = {e.filename: (before.read(e), e.compress_type) for e in before.infolist()}
    mode = 0o640
    path.chmod(mode)
    add_bytecode(path)
    add_bytecode(path)
    with zipfile.ZipFile(path) as after:
        names = after.namelist()
        assert {n: (after.read(n), after.getinfo(n).compress_type) for n in kept} == kept
    assert sorted(names) == sorted([*kept, "pkg/__init__.pyc", "pkg/mod.pyc"])
    assert path.stat().st_mode & 0o777 == mode
    assert [p.name for p in path.parent.iterdir()] == ["pyspark.zip"]  # no temporary left


def test_a_run_compiles_only_what_lacks_current_bytecode_and_else_replaces_nothing(
    tmp_path: Path,
) -> None:
    path = find_zip(str(spark_home(tmp_path)))
    assert add_bytecode(path).compiled == 2
    before = path.stat()
    again = add_bytecode(path)
    assert (again.modules, again.compiled) == (2, 0)
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    rewrite(path, "pkg/mod.py", b"def answer():\n    return 7\n")
    assert add_bytecode(path).compiled == 1
    assert current_bytecode(path).compiled == 2
    assert probe(path) == {"answer": 7, "compiled": 0}


def test_test_modules_get_none_and_bytecode_given_them_before_is_taken_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """pyspark's test suites (919 of its 1,286 modules in 4.3) are never imported by a Spark
    process, and each entry of the zip costs a worker's first task on Python 3.11, which reads
    the zip's directory again (``importlib.invalidate_caches``)."""
    test_source = b"def test_answer():\n    assert True\n"
    sources = {**SOURCES, "pkg/tests/__init__.py": b"", "pkg/tests/test_mod.py": test_source}
    home = spark_home(tmp_path, sources)
    path = home / ZIP_IN_SPARK_HOME
    done = add_bytecode(path)
    assert (done.modules, done.compiled, done.removed) == (2, 2, 0)
    with zipfile.ZipFile(path) as archive:
        assert not [n for n in archive.namelist() if n.startswith("pkg/tests/") and n[-1] == "c"]
    # a zip compiled by a version that gave the tests bytecode too, and a test module that is
    # bytecode only (no source beside it: kept, it is the module)
    rewrite(path, "pkg/tests/test_mod.pyc", pyc(test_source, "pkg/tests/test_mod.py"))
    rewrite(path, "pkg/tests/test_only.pyc", pyc(test_source, "pkg/tests/test_only.py"))
    assert cli.main(["pyspark-bytecode", "--spark-home", str(home)]) == 0
    assert "took out the bytecode of 1 test modules" in capsys.readouterr().out
    with zipfile.ZipFile(path) as archive:
        compiled = sorted(n for n in archive.namelist() if n.endswith(".pyc"))
        assert archive.read("pkg/tests/test_mod.py") == test_source
    assert compiled == ["pkg/__init__.pyc", "pkg/mod.pyc", "pkg/tests/test_only.pyc"]
    assert probe(path) == {"answer": 42, "compiled": 0}


def test_a_module_of_bytecode_only_is_kept(tmp_path: Path) -> None:
    sourceless = pyc(b"def answer():\n    return 5\n", "pkg/mod.py")
    home = spark_home(tmp_path, {"pkg/__init__.py": SOURCES["pkg/__init__.py"]})
    path = home / ZIP_IN_SPARK_HOME
    rewrite(path, "pkg/mod.pyc", sourceless)
    add_bytecode(path)
    with zipfile.ZipFile(path) as archive:
        assert archive.read("pkg/mod.pyc") == sourceless
    assert probe(path) == {"answer": 5, "compiled": 0}


def test_an_edited_source_is_compiled_again_not_shadowed_by_its_old_bytecode(
    tmp_path: Path,
) -> None:
    path = find_zip(str(spark_home(tmp_path)))
    add_bytecode(path)
    rewrite(path, "pkg/mod.py", b"def answer():\n    return 7\n")
    assert probe(path) == {"answer": 7, "compiled": 1}
    assert current_bytecode(path).compiled == 1


def test_bytecode_of_another_python_is_ignored(tmp_path: Path) -> None:
    path = find_zip(str(spark_home(tmp_path)))
    add_bytecode(path)
    with zipfile.ZipFile(path) as archive:
        foreign = b"\x00\x00\r\n" + archive.read("pkg/mod.pyc")[4:]
    rewrite(path, "pkg/mod.pyc", foreign)
    assert probe(path) == {"answer": 42, "compiled": 1}


def test_check_counts_the_modules_and_says_when_some_lack_bytecode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = spark_home(tmp_path)
    assert cli.main(["pyspark-bytecode", "--spark-home", str(home), "--check"]) == 1
    assert "0 of 2 modules have bytecode" in capsys.readouterr().out
    assert cli.main(["pyspark-bytecode", "--spark-home", str(home)]) == 0
    assert "2 modules compiled for Python 3." in capsys.readouterr().out
    assert cli.main(["pyspark-bytecode", "--spark-home", str(home), "--check"]) == 0


def test_a_missing_or_broken_zip_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["pyspark-bytecode", "--spark-home", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[0] == (
        f"statetier pyspark-bytecode: {tmp_path / 'none' / ZIP_IN_SPARK_HOME}: no such file "
        f"(is {tmp_path / 'none'} a Spark home?)"
    )
    home = spark_home(tmp_path)
    (home / ZIP_IN_SPARK_HOME).write_bytes(b"not a zip")
    with pytest.raises(BytecodeError, match=r"pyspark\.zip: File is not a zip file"):
        add_bytecode(home / ZIP_IN_SPARK_HOME)


def test_a_module_that_does_not_compile_is_named_and_the_zip_left_as_it_was(
    tmp_path: Path,
) -> None:
    home = spark_home(tmp_path, {**SOURCES, "pkg/bad.py": b"def (:\n"})
    path = home / ZIP_IN_SPARK_HOME
    before = path.read_bytes()
    with pytest.raises(BytecodeError, match=r"pkg/bad.py: invalid syntax \(line 1\)"):
        add_bytecode(path)
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == ["pyspark.zip"]


def test_the_development_spark_imports_pyspark_from_bytecode() -> None:
    """make install compiles the dev environment's pyspark.zip, as Dockerfile.spark does the
    image's: Spark's Python processes in the tests start as they do in the image."""
    path = find_zip(None)
    found = current_bytecode(path)
    assert found.compiled == found.modules > 300, (
        f"{path}: {found.compiled} of {found.modules} modules have bytecode; run "
        "`statetier pyspark-bytecode` (make install does)"
    )
