"""``statetier pyspark-bytecode``: bytecode in Spark's ``pyspark.zip``, so that the Python processes
Spark starts import pyspark without compiling it.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on the path of every Python process it
starts: each executor's worker daemon, and on a Spark Connect server each streaming query's
``foreachBatch`` process. That zip holds sources only, and Python's zip importer writes no cache,
so every such process compiles the hundreds of pyspark modules it imports, every time. On Connect
this is paid per streaming query: each query runs on a session of its own, whose Python workers
are a new daemon on every executor, beside the query's new ``foreachBatch`` process.

This adds, beside each module's source in the zip, its bytecode for the Python that runs the
command (the image's: run it with the Python the workers use). The bytecode is *checked*: the
importer hashes the source beside it and compiles the source as before when they differ, and a
Python of another version ignores it, so the zip imports as it did in every case, only faster.
The zip's own entries are copied unchanged; the new zip replaces the old in one rename.

pyspark's own test suites (its ``tests`` packages: 919 of the 1,286 modules in Spark 4.3's zip)
get none: no Spark process imports them, and every entry of the zip has a cost. A Python worker's
first task calls ``importlib.invalidate_caches()`` (pyspark's ``setup_spark_files``, once it puts
the job's files on the path), and Python 3.11 then reads the whole directory of every zip on the
path again. Measured on a worker's imports and that call (2026-12-01): with bytecode for every
module 0.43 s for the call and 1.11 s of CPU in all; without the tests' 0.16-0.21 s and
0.65-0.72 s. Bytecode this command gave a test module before is taken out.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import marshal
import os
import sys
import tempfile
import time
import warnings
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ZIP_IN_SPARK_HOME = Path("python", "lib", "pyspark.zip")
# a pyc's flags: hash-based (0b01) and checked against its source when imported (0b10)
CHECKED_HASH_PYC = 0b11


class BytecodeError(Exception):
    """A pyspark.zip that cannot be found or read; the message says which and why."""


@dataclass(frozen=True)
class Compiled:
    """What one run found or did: the zip, its modules, how many of them, the time."""

    path: Path
    modules: int
    compiled: int  # (add_bytecode) compiled by this run; (current_bytecode) with current bytecode
    seconds: float
    removed: int = 0  # (add_bytecode) pycs of test modules taken out


def find_zip(spark_home: str | None) -> Path:
    """``pyspark.zip`` of ``spark_home``, else of ``$SPARK_HOME``, else of the pyspark package this
    Python imports (a pip-installed pyspark is its own Spark home)."""
    home = spark_home or os.environ.get("SPARK_HOME")
    if home is None:
        spec = importlib.util.find_spec("pyspark")
        if spec is None or spec.origin is None:
            raise BytecodeError(
                "no Spark found: pass --spark-home, set SPARK_HOME, or install pyspark"
            )
        home = str(Path(spec.origin).parent)
    path = Path(home) / ZIP_IN_SPARK_HOME
    if not path.is_file():
        raise BytecodeError(f"{path}: no such file (is {home} a Spark home?)")
    return path


def pyc(source: bytes, filename: str) -> bytes:
    """The checked hash-based pyc of ``source``, compiled as the zip importer would compile it."""
    normalized = source.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    with warnings.catch_warnings():  # what a module's source warns of, its import says
        warnings.simplefilter("ignore")
        code = compile(normalized, filename, "exec", dont_inherit=True)
    return (
        importlib.util.MAGIC_NUMBER
        + CHECKED_HASH_PYC.to_bytes(4, "little")
        + importlib.util.source_hash(source)
        + marshal.dumps(code)
    )


def add_bytecode(path: Path) -> Compiled:
    """Give every module of the zip at ``path`` (but the test suites') a current pyc beside its
    source, compiling only those that have none (or a stale one): the zip is rewritten with its
    other entries as they are, or left alone when nothing needs compiling, so a second run
    replaces no file."""
    started = time.perf_counter()
    try:
        with zipfile.ZipFile(path) as old:
            modules, stale = _stale_modules(old)
            surplus = _test_bytecode(old)
            if stale or surplus:
                _rewrite(path, old, stale, surplus)
    except (OSError, zipfile.BadZipFile) as exc:
        raise BytecodeError(f"{path}: {exc}") from exc
    except SyntaxError as exc:
        raise BytecodeError(f"{exc.filename}: {exc.msg} (line {exc.lineno})") from exc
    return Compiled(path, modules, len(stale), time.perf_counter() - started, len(surplus))


def _rewrite(path: Path, old: zipfile.ZipFile, stale: set[str], surplus: set[str]) -> None:
    """Replace the zip at ``path`` (open as ``old``) by a copy in which each source in
    ``stale`` has a new pyc beside it; a stale pyc and the pycs in ``surplus`` are left out,
    every other entry copied."""
    with tempfile.NamedTemporaryFile(
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False
    ) as handle:
        temporary = Path(handle.name)
    try:
        with zipfile.ZipFile(temporary, "w") as new:
            for entry in old.infolist():
                if entry.filename[:-1] in stale or entry.filename in surplus:
                    continue  # the stale pyc of a source compiled below, or a test's
                data = old.read(entry)
                new.writestr(entry, data)
                if entry.filename in stale:
                    info = zipfile.ZipInfo(entry.filename + "c", entry.date_time)
                    info.compress_type = zipfile.ZIP_DEFLATED
                    new.writestr(info, pyc(data, f"{path}/{entry.filename}"))
        _same_owner_and_mode(temporary, path)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _same_owner_and_mode(new: Path, old: Path) -> None:
    """Give ``new`` the mode of ``old``, and its owner where this user may (root in an image's
    build): the file that replaces it is otherwise this user's, readable by them alone."""
    status = old.stat()
    with contextlib.suppress(PermissionError):
        os.chown(new, status.st_uid, status.st_gid)
    new.chmod(status.st_mode & 0o7777)


def current_bytecode(path: Path) -> Compiled:
    """How many of the zip's modules have bytecode this Python takes (its magic number, and
    the hash of the source beside it)."""
    started = time.perf_counter()
    try:
        with zipfile.ZipFile(path) as archive:
            modules, stale = _stale_modules(archive)
    except (OSError, zipfile.BadZipFile) as exc:
        raise BytecodeError(f"{path}: {exc}") from exc
    return Compiled(path, modules, modules - len(stale), time.perf_counter() - started)


def _stale_modules(archive: zipfile.ZipFile) -> tuple[int, set[str]]:
    """The number of module sources in ``archive``, and those without a current pyc beside
    them (none, one of another Python, or one of an older source)."""
    names = set(archive.namelist())
    sources = [name for name in names if name.endswith(".py") and _gets_bytecode(name)]
    stale = {
        name
        for name in sources
        if name + "c" not in names or not _is_current(archive.read(name + "c"), archive.read(name))
    }
    return len(sources), stale


def _gets_bytecode(name: str) -> bool:
    """Whether the module at ``name`` gets bytecode: not one of a ``tests`` package."""
    return "tests" not in name.split("/")[:-1]


def _test_bytecode(archive: zipfile.ZipFile) -> set[str]:
    """The pycs beside the sources of test modules (an earlier run added them)."""
    names = set(archive.namelist())
    return {
        name + "c"
        for name in names
        if name.endswith(".py") and not _gets_bytecode(name) and name + "c" in names
    }


def _is_current(compiled: bytes, source: bytes) -> bool:
    return (
        compiled[:4] == importlib.util.MAGIC_NUMBER
        and int.from_bytes(compiled[4:8], "little") & 0b1 == 1
        and compiled[8:16] == importlib.util.source_hash(source)
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="statetier pyspark-bytecode",
        description="Add bytecode to Spark's pyspark.zip for this Python (run it with the "
        "Python of Spark's workers, e.g. in the Spark image's build).",
    )
    parser.add_argument("--spark-home", help="the Spark home (default: $SPARK_HOME or pyspark's)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="only count the modules with current bytecode; exit 1 when some have none",
    )
    args = parser.parse_args(argv)
    path = find_zip(args.spark_home)
    version = f"Python {sys.version_info.major}.{sys.version_info.minor}"
    if args.check:
        found = current_bytecode(path)
        print(f"{path}: {found.compiled} of {found.modules} modules have bytecode for {version}")
        return 0 if found.compiled == found.modules else 1
    done = add_bytecode(path)
    if done.compiled:
        print(f"{path}: {done.compiled} modules compiled for {version} in {done.seconds:.1f} s")
    else:
        print(f"{path}: all {done.modules} modules have bytecode for {version} already")
    if done.removed:
        print(f"{path}: took out the bytecode of {done.removed} test modules (none imports them)")
    return 0
