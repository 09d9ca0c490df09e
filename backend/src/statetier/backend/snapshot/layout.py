"""Every object name of a checkpoint location, in one place.

Layout under the checkpoint URI::

    writer.json                                          the writer lease (see fencing)
    manifests/epoch-0000000007.json                      the commit record of epoch 7, written last
    data/epoch-0000000007/<owner>/<state>/<range>.<kind>.kgd     keyed state of one range
    data/epoch-0000000007/<owner>/compacted/<state>/<range>.base.kgd   a local compaction's output
    data/epoch-0000000007/<owner>/compacted/<state>/<job>-a<n>/<range>.base.kgd   a service's
    data/epoch-0000000007/<owner>/results/<i>-of-<p>.json         a Spark range's result (only
                                                                  when the driver missed it)
    operator/epoch-0000000007/<owner>/<index>-of-<p>.ops          operator state of one instance

Names are deterministic in (epoch, writer, state, range), so a retried or speculative attempt of
one writer writes the same name with the same bytes, and two writers never write the same name:
a fenced writer cannot overwrite a file another writer committed. Every file but the lease sits
under a directory of its epoch, which is what retention goes by (:func:`epoch_of`). The
compaction service finds the location a job writes under (its tenant) with
:func:`location_of`, from the same names.
"""

from __future__ import annotations

import hashlib
import re
import urllib.parse

__all__ = [
    "LEASE",
    "attempt_prefix",
    "MANIFESTS",
    "TOP_DIRS",
    "compacted_base_name",
    "compacted_dir",
    "data_dir",
    "epoch_of",
    "error_name",
    "keyed_file_name",
    "location_of",
    "manifest_epoch",
    "manifest_name",
    "operator_file_name",
    "result_name",
    "results_dir",
    "state_dir",
]

LEASE = "writer.json"
MANIFESTS = "manifests"
DATA = "data"
OPERATOR = "operator"
TOP_DIRS = (MANIFESTS, DATA, OPERATOR)
MAX_STATE_DIR = 200  # characters of a state's directory segment before it is hashed
_MANIFEST = re.compile(r"epoch-(\d{10})\.json$")
_EPOCH_DIR = re.compile(r"(?:^|/)epoch-(\d{10})(?:/|$)")
_IN_EPOCH = re.compile(r"/(?:data|operator|manifests)/epoch-\d{10}(?:[/.]|$)")


def _epoch_dir(top: str, epoch: int) -> str:
    return f"{top}/epoch-{epoch:010d}"


def data_dir(epoch: int) -> str:
    """The directory of ``epoch``'s keyed data files (and a Spark driver's result files)."""
    return _epoch_dir(DATA, epoch)


def state_dir(state: str) -> str:
    """The directory segment of a state's files: one per name, safe for any name.

    State names are only required to be unique (as in Flink), so a name may be empty, ``.``,
    ``..``, or contain ``/``. Most names are simply percent-quoted; a name that would quote to
    an empty or dot-only segment, contains ``/`` or starts with ``~`` is written as ``~`` and
    the hex of its UTF-8 bytes. Quoting never produces a leading ``~`` for the other names, so
    two names never share a directory, and no segment is one a path check refuses (empty,
    ``.``, ``..``, an encoded slash).
    """
    quoted = urllib.parse.quote(state, safe="")
    if not quoted.strip(".") or "/" in state or state.startswith("~"):
        quoted = "~" + state.encode("utf-8", "surrogatepass").hex()
    if len(quoted) > MAX_STATE_DIR:  # file systems limit a name to 255 bytes
        digest = hashlib.sha256(state.encode("utf-8", "surrogatepass")).hexdigest()
        return "~~" + digest  # "~" + hex never has a second "~"
    return quoted


def keyed_file_name(epoch: int, state: str, key_groups: object, kind: str, owner: str) -> str:
    """A range's keyed-state file (``kind`` base or delta) written by ``owner``."""
    return f"{_epoch_dir(DATA, epoch)}/{owner}/{state_dir(state)}/{key_groups}.{kind}.kgd"


def operator_file_name(epoch: int, index: int, parallelism: int, owner: str) -> str:
    return f"{_epoch_dir(OPERATOR, epoch)}/{owner}/{index}-of-{parallelism}.ops"


def manifest_name(epoch: int) -> str:
    return f"{MANIFESTS}/epoch-{epoch:010d}.json"


def manifest_epoch(name: str) -> int | None:
    """The epoch of a manifest's file name (None: not a manifest's name)."""
    found = _MANIFEST.search(name)
    return int(found.group(1)) if found else None


def compacted_dir(epoch: int, owner: str, state: str) -> str:
    """Where the compactions planned after ``epoch``'s commit write their bases."""
    return f"{_epoch_dir(DATA, epoch)}/{owner}/compacted/{state_dir(state)}"


def compacted_base_name(output_prefix: str, key_groups: str) -> str:
    """The base a compaction writes under its request's output prefix (a URL or a name)."""
    return f"{output_prefix.rstrip('/')}/{key_groups}.base.kgd"


def attempt_prefix(output_prefix: str, job_id: str, attempt: int) -> str:
    """Where attempt ``attempt`` of a compaction service's job writes: each attempt apart, so a
    worker that lost its lease can never overwrite the output of the one that finished."""
    return f"{output_prefix.rstrip('/')}/{job_id}-a{attempt}"


def results_dir(epoch: int, owner: str) -> str:
    """Where the Spark state hosts' results of ``owner``'s ``epoch`` are (see result_name)."""
    return f"{_epoch_dir(DATA, epoch)}/{owner}/results"


def result_name(epoch: int, owner: str, index: int, parallelism: int) -> str:
    """Where a Spark state host says which files it wrote for range ``index`` of ``epoch``."""
    return f"{results_dir(epoch, owner)}/{index}-of-{parallelism}.json"


def error_name(result: str) -> str:
    """Where a host that failed to snapshot a range says why (beside the result's name)."""
    return result.removesuffix(".json") + ".error.txt"


def epoch_of(name: str) -> int | None:
    """The epoch a data, operator or manifest file name belongs to."""
    found = _EPOCH_DIR.search(name) or _MANIFEST.search(name)
    return int(found.group(1)) if found else None


def location_of(url: str) -> str:
    """The checkpoint location (URI) that a URL of one of its files or directories lies under:
    everything before its last ``data/epoch-…``, ``operator/epoch-…`` or ``manifests/epoch-…``;
    for other URLs, their parent."""
    found = list(_IN_EPOCH.finditer(url))
    return url[: found[-1].start()] if found else url.rstrip("/").rsplit("/", 1)[0]
