"""statetier checkpoint list|inspect|verify|gc URI: checkpoints for the people who run them.

Long operations (verify, gc) show a progress bar on a terminal. Errors say which file, which
block and what is wrong; the exit status is 0 when all is well, 1 when verify found problems,
2 when the command could not run (bad URI, no checkpoint, storage unreachable). A storage call is
tried 6 times with backoff; a refused connection fails in a few seconds. Storage options go as
-o key=value (-o endpoint_url=http://127.0.0.1:8333); credentials come from the usual AWS_*
environment variables (AWS_ENDPOINT_URL too).

Savepoints (docs/checkpoints.md): savepoint SOURCE_URI DEST_URI takes one, delete-savepoint URI
deletes one, restore-spark SAVEPOINT_URI NEW_SPARK_CKPT_URI writes its Spark log entries into a
new query's checkpoint location; list, inspect and verify read a savepoint as a checkpoint (verify
checks its marker and Spark entries too), gc refuses one. These three exit 1 on any failure
(2: a usage error).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Sequence
from typing import Any

from statetier.backend.snapshot.format import CorruptFileError
from statetier.backend.snapshot.gc import collect_garbage
from statetier.backend.snapshot.savepoint import (
    MARKER,
    delete_savepoint,
    read_savepoint,
    require_savepoint,
    take_savepoint,
)
from statetier.backend.snapshot.spark_log import restore_spark_log
from statetier.backend.snapshot.store import NoSnapshotError, SnapshotStore
from statetier.backend.snapshot.verify import verify_savepoint, verify_store
from tqdm import tqdm

__all__ = ["main"]


def _options(pairs: Sequence[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"storage option {pair!r} is not key=value")
        options[key] = value
    return options


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="statetier checkpoint", description=__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    for name, helptext in (
        ("list", "committed epochs with their size"),
        ("inspect", "what one epoch's manifest names: states, chains, operator files"),
        ("verify", "read every file the manifests name and check every block"),
        ("gc", "delete files no retained manifest names"),
    ):
        cmd = sub.add_parser(name, help=helptext)
        cmd.add_argument("uri", help="checkpoint location: s3://bucket/prefix, file:///path, ...")
        cmd.add_argument("-o", "--option", action="append", default=[], help="storage key=value")
        if name in ("inspect", "verify"):
            cmd.add_argument("--epoch", type=int, help="one epoch (default: latest / all)")
        if name in ("list", "inspect"):
            cmd.add_argument("--json", action="store_true", help="print JSON")
        if name == "gc":
            cmd.add_argument("--retained", type=int, default=3, help="epochs to keep")
            cmd.add_argument("--dry-run", action="store_true", help="only say what would go")
    _savepoint_parsers(sub)
    return parser


def _savepoint_parsers(sub: Any) -> None:
    take = sub.add_parser("savepoint", help="copy one committed epoch into a savepoint")
    take.add_argument("uri", metavar="SOURCE_URI", help="the checkpoint location")
    take.add_argument("dest", metavar="DEST_URI", help="where the savepoint goes (empty)")
    take.add_argument("--epoch", type=int, help="a committed epoch (default: the latest)")
    take.add_argument(
        "--spark-checkpoint",
        metavar="SPARK_CKPT_URI",
        help="the query's Spark checkpoint location: its log entries of the epoch's micro-batch",
    )
    take.add_argument("--json", action="store_true", help="print one JSON object")
    delete = sub.add_parser("delete-savepoint", help="delete a savepoint's files")
    delete.add_argument("uri", metavar="URI", help="the savepoint")
    spark = sub.add_parser(
        "restore-spark", help="write a savepoint's Spark log entries into a new query's location"
    )
    spark.add_argument("uri", metavar="SAVEPOINT_URI", help="the savepoint")
    spark.add_argument("spark_uri", metavar="NEW_SPARK_CKPT_URI", help="an empty location")
    for cmd in (take, delete, spark):
        cmd.add_argument("-o", "--option", action="append", default=[], help="storage key=value")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.action in _SAVEPOINT_ACTIONS:
        return _savepoint_main(args)
    try:
        store = SnapshotStore(args.uri, **_options(args.option))
        return int(_ACTIONS[args.action](store, args))
    except NoSnapshotError as exc:
        print(f"statetier checkpoint {args.action}: {exc}", file=sys.stderr)
        return 2
    except CorruptFileError as exc:
        print(f"statetier checkpoint {args.action}: corrupt: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"statetier checkpoint {args.action}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


def _savepoint_main(args: argparse.Namespace) -> int:
    """The savepoint actions: 0, or a line naming the failure and 1 (the contract the
    operator's snapshot Job is written against)."""
    try:
        options = _options(args.option)
        return int(_SAVEPOINT_ACTIONS[args.action](SnapshotStore(args.uri, **options), args))
    except (OSError, ValueError) as exc:  # storage, corrupt files, refusals, bad settings
        print(f"statetier checkpoint {args.action}: {_reason(exc)}", file=sys.stderr)
        return 1


def _reason(exc: BaseException) -> str:
    """The first line of an error, with its kind unless its own message says it all."""
    text = (str(exc).strip().splitlines() or [""])[0]
    plain = isinstance(exc, (NoSnapshotError, FileExistsError, CorruptFileError))
    return text if plain else f"{type(exc).__name__}: {text}"


def _savepoint(source: SnapshotStore, args: argparse.Namespace) -> int:
    options = _options(args.option)
    dest = SnapshotStore(args.dest, **options)
    marker = take_savepoint(source, dest, args.epoch, args.spark_checkpoint, options)
    manifest = dest.manifest(marker.epoch)
    files = [*manifest.files(), *marker.spark_files]
    report = {
        "uri": args.dest,
        "source": args.uri,
        "epoch": marker.epoch,
        "bytes": sum(f.size for f in files),
        "files": len(files),
        "spark_batch": marker.spark_batch,
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"savepoint of epoch {marker.epoch} of {args.uri} at {args.dest}: {len(files)} "
            f"file(s), {report['bytes']:,} bytes; Spark micro-batch {marker.spark_batch}"
        )
    return 0


def _delete_savepoint(store: SnapshotStore, args: argparse.Namespace) -> int:
    deleted = delete_savepoint(store)
    print(f"deleted the savepoint at {store.uri}: {len(deleted)} file(s)")
    return 0


def _restore_spark(store: SnapshotStore, args: argparse.Namespace) -> int:
    marker = require_savepoint(store)
    if marker.spark_batch is None:
        raise NoSnapshotError(
            f"the savepoint at {store.uri} holds no Spark log entries (taken without "
            "--spark-checkpoint)"
        )
    count = restore_spark_log(store, marker.spark_files, args.spark_uri, _options(args.option))
    print(
        f"wrote {count} Spark log entries (up to micro-batch {marker.spark_batch}) to "
        f"{args.spark_uri}: a query started there resumes after epoch {marker.epoch}"
    )
    return 0


def _list(store: SnapshotStore, args: argparse.Namespace) -> int:
    epochs = store.epochs()
    if not epochs:
        raise NoSnapshotError(f"no committed snapshot under {store.uri}")
    rows = []
    for epoch in epochs:
        manifest = store.manifest(epoch)
        new = [f for f in manifest.files() if f.epoch == epoch]
        rows.append(
            {
                "epoch": epoch,
                "created": datetime.datetime.fromtimestamp(
                    manifest.created_ms / 1000, datetime.UTC
                ).isoformat(timespec="seconds"),
                "parallelism": manifest.parallelism,
                "states": len(manifest.states),
                "files": len(manifest.files()),
                "bytes": sum(f.size for f in manifest.files()),
                "new_bytes": sum(f.size for f in new),
                "deltas": sum(len(c.deltas) for c in manifest.chains()),
                "owner": manifest.owner,
            }
        )
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(
        f"{'epoch':>8} {'created (UTC)':>25} {'p':>3} {'files':>6} {'bytes':>12} "
        f"{'new bytes':>12} {'deltas':>6}  owner"
    )
    for r in rows:
        print(
            f"{r['epoch']:>8} {r['created']:>25} {r['parallelism']:>3} {r['files']:>6} "
            f"{r['bytes']:>12,} {r['new_bytes']:>12,} {r['deltas']:>6}  {r['owner']}"
        )
    return 0


def _inspect(store: SnapshotStore, args: argparse.Namespace) -> int:
    manifest = store.manifest(args.epoch)
    if args.json:
        print(manifest.to_json().decode())
        return 0
    print(f"epoch {manifest.epoch} (format {manifest.format_version}, owner {manifest.owner})")
    print(
        f"  max parallelism {manifest.max_parallelism}, parallelism {manifest.parallelism}, "
        f"key serializer {manifest.key_serializer}"
    )
    for name, meta in sorted(manifest.states.items()):
        print(f"  state {name}: {meta['kind']}, ttl {meta['ttl']}, {meta['serializers']}")
    for chain in manifest.chains():
        deltas = ", ".join(f"e{d.epoch} {d.size:,} B" for d in chain.deltas) or "none"
        print(
            f"    {chain.state} [{chain.key_groups}]: base e{chain.base.epoch} "
            f"{chain.base.size:,} B; deltas: {deltas}"
        )
    for entry in manifest.operator_files:
        print(f"  operator state of instance {entry.operator_index}: {entry.size:,} B")
    return 0


def _verify(store: SnapshotStore, args: argparse.Namespace) -> int:
    bar = tqdm(total=0, unit="B", unit_scale=True, desc="verify", disable=None, file=sys.stderr)

    def planned(total: int) -> None:
        bar.total = total
        bar.refresh()

    with bar:
        epochs = None if args.epoch is None else [args.epoch]
        report = verify_store(store, epochs, progress=bar.update, on_plan=planned)
    report.problems += verify_savepoint(store)
    if not report.epochs:
        raise NoSnapshotError(f"no committed snapshot under {store.uri}")
    for problem in report.problems:
        print(f"PROBLEM {problem}")
    verdict = "OK" if report.ok else f"{len(report.problems)} problem(s)"
    print(
        f"{verdict}: {len(report.epochs)} epoch(s), {report.files} file(s), "
        f"{report.bytes:,} bytes, {report.entries:,} entries checked"
    )
    return 0 if report.ok else 1


def _gc(store: SnapshotStore, args: argparse.Namespace) -> int:
    if read_savepoint(store) is not None:
        raise ValueError(
            f"{store.uri} is a savepoint ({MARKER}): gc never touches one; delete it with "
            f"statetier checkpoint delete-savepoint {store.uri}"
        )
    if not store.epochs():  # a mistyped URI: nothing there is ours to delete
        raise NoSnapshotError(f"no committed snapshot under {store.uri}; nothing to collect")
    with tqdm(desc="gc", unit="file", disable=None, file=sys.stderr) as bar:
        report = collect_garbage(store, args.retained, dry_run=args.dry_run, progress=bar.update)
    verb = "would delete" if args.dry_run else "deleted"
    for name in [*report.deleted_manifests, *report.deleted_files]:
        print(f"{verb} {name}")
    print(
        f"{verb} {len(report.deleted_manifests)} manifest(s) and {len(report.deleted_files)} "
        f"file(s), {report.freed_bytes:,} bytes; retained epochs {report.retained_epochs}"
    )
    return 0


_ACTIONS = {"list": _list, "inspect": _inspect, "verify": _verify, "gc": _gc}
_SAVEPOINT_ACTIONS = {
    "savepoint": _savepoint,
    "delete-savepoint": _delete_savepoint,
    "restore-spark": _restore_spark,
}
