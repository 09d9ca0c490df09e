"""statetier checkpoint list|inspect|verify|gc URI: checkpoints for the people who run them.

Long operations (verify, gc) show a progress bar on a terminal. Errors say which file, which
block and what is wrong; the exit status is 0 when all is well, 1 when verify found problems,
2 when the command could not run (bad URI, no checkpoint, storage unreachable). A storage call is
tried 6 times with backoff; a refused connection fails in a few seconds. Storage options go as
-o key=value (-o endpoint_url=http://127.0.0.1:8333); credentials come from the usual AWS_*
environment variables.
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
from statetier.backend.snapshot.store import NoSnapshotError, SnapshotStore
from statetier.backend.snapshot.verify import verify_store
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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
