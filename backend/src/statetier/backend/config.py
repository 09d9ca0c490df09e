"""The one configuration schema of statetier.

Every setting the backend reads is declared here once, with its name, environment variable,
Spark conf key, type, default, meaning and validation. The Kubernetes operator writes exactly
these keys (it imports this module), and ``docs/configuration.md`` is generated from it, so the
three can never drift apart. The module imports nothing from Spark on purpose: the operator and
the compaction service load it without Spark installed.

Sources, highest precedence first: values passed in code, Spark conf, environment, default.
A bad value raises :class:`ConfigError` naming the setting, where the value came from and what
is allowed. Every value is checked where it is parsed: numbers in ASCII digits only (``int()``
would take ``"٤٢"``), finite, within a sane range (a budget of ``1.5`` bytes or a chunk of
``1t`` is a typo, not a wish); URIs with a served scheme and an absolute location; endpoints as
http(s) URLs with a host.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import logging
import math
import os
import re
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, Literal, TypeVar, cast, get_args

__all__ = [
    "SETTINGS",
    "ConfigError",
    "Setting",
    "StatetierConfig",
    "load_config",
    "render_markdown",
]

T = TypeVar("T")

ENV_PREFIX = "STATETIER_"
SPARK_PREFIX = "spark.statetier."
log = logging.getLogger("statetier.config")


class ConfigError(ValueError):
    """A configuration value is missing, malformed or out of range."""


# --------------------------------------------------------------------------- value parsers
# Each parser takes the raw text (or an already-typed value passed in code) and returns the
# typed value, or raises ValueError with a short reason; Setting.parse adds the context.

_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:e[+-]?[0-9]+)?", re.IGNORECASE)


def _finite(value: float | int | str) -> float:
    try:
        number = float(value)
    except OverflowError:
        raise ValueError("expected a finite number") from None
    if not math.isfinite(number):
        raise ValueError("expected a finite number")
    return number


def _number_text(raw: object, pattern: re.Pattern[str], what: str) -> str:
    """``raw`` as the text of a number that ``pattern`` matches. A boolean is refused (Python
    counts it as an int, a setting does not), and so is a digit that is not ASCII."""
    if isinstance(raw, bool):
        raise ValueError(f"expected {what}, got a boolean")
    text = str(raw).strip()
    if not pattern.fullmatch(text):
        raise ValueError(f"expected {what} in ASCII digits")
    return text


def parse_int(raw: object) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    return int(_number_text(raw, _INT, "an integer"))


def parse_float(raw: object) -> float:
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return _finite(raw)
    return _finite(_number_text(raw, _FLOAT, "a number"))


def parse_bool(raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError("expected true or false")


def parse_str(raw: object) -> str:
    return str(raw).strip()


def parse_list(raw: object) -> tuple[str, ...]:
    """Comma-separated text, or a sequence of strings given in code."""
    if isinstance(raw, (list, tuple)):
        return tuple(str(item).strip() for item in raw if str(item).strip())
    return tuple(part.strip() for part in str(raw).split(",") if part.strip())


_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(?:([kmgt])(?:i?b)?|(b)?)")
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(ms|s|min|m|h)?")


def parse_size(raw: object) -> int:
    """Bytes, with an optional binary unit: ``512m``, ``2g``, ``1073741824``, ``64KiB``,
    ``1.5g``; a fraction needs a unit (``1.5`` bytes is a typo)."""
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise ValueError(f"expected a size such as 512m, got {type(raw).__name__}")
    if isinstance(raw, int):
        return raw
    match = _SIZE.fullmatch(raw.strip().lower())
    if not match:
        raise ValueError("expected a size such as 512m, 2g or a number of bytes (ASCII digits)")
    number, unit = match.group(1), match.group(2) or ""
    if "." in number and not unit:
        raise ValueError("a fraction of a byte; give a unit (1.5g) or whole bytes")
    if "." not in number:
        return int(number) * _SIZE_UNITS[unit]
    return int(_finite(number) * _SIZE_UNITS[unit])


def parse_duration(raw: object) -> float:
    """Seconds, with an optional unit: ``500ms``, ``30s``, ``5m``, ``1h``, ``2.5``."""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return _finite(raw)
    match = _DURATION.fullmatch(str(raw).strip().lower())
    if not match:
        raise ValueError("expected a duration such as 500ms, 30s or 5m (ASCII digits)")
    return _finite(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]


URI_SCHEMES = ("s3", "file", "memory")
CHAIN_URL_PROBLEM = (
    "'::' chains two locations (an fsspec chain URL), which statetier does not follow; give "
    "one location, such as s3://bucket/prefix or file:///absolute/path"
)
_BUCKET = re.compile(r"[a-z0-9](?:[a-z0-9.\-]{0,61}[a-z0-9])?")  # S3 wants 3+; others less


def parse_uri(raw: object) -> str:
    """A checkpoint location: ``s3://bucket[/prefix]``, ``file:///absolute/path``,
    ``memory://name``, or ``file://./dir`` (the one relative form, explicit about it: the
    default). Anything else relative (``""``, ``dir``, ``file://dir``), another scheme, a
    malformed URL (``s3:/bucket``) or an fsspec chain (``file:///a::s3://b``: data would land
    under the first part, which no compaction reads) is refused rather than guessed at."""
    if not isinstance(raw, str):
        raise ValueError(f"expected a URI string, got {type(raw).__name__}")
    text = raw.strip()
    if "::" in text:
        raise ValueError(CHAIN_URL_PROBLEM)
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise ValueError("expected a URI such as s3://bucket/prefix or file:///absolute/path")
    if scheme not in URI_SCHEMES:
        raise ValueError(f"scheme {scheme!r} is not one of {', '.join(URI_SCHEMES)} (lower case)")
    if any(c.isspace() or c in "?#\\" for c in rest):
        raise ValueError("a URI may not contain whitespace, '?', '#' or a backslash")
    if scheme == "file" and not (rest.startswith("/") or rest.startswith("./")):
        raise ValueError(f"{text!r} is a relative path; write file:///absolute/path")
    if scheme == "s3" and not _BUCKET.fullmatch(rest.split("/", 1)[0]):
        raise ValueError("expected s3://bucket/prefix with a valid bucket name")
    if scheme == "memory" and not rest.strip("/"):
        raise ValueError("expected memory://name")
    if "/../" in f"/{rest}/" or "/./" in f"/{rest.removeprefix('./')}/":
        raise ValueError("a URI may not contain '.' or '..' segments")
    return text


def parse_optional_uri(raw: object) -> str:
    """A location as :func:`parse_uri` takes it, or empty (the setting is off)."""
    if isinstance(raw, str) and not raw.strip():
        return ""
    return parse_uri(raw)


def parse_optional_spark_uri(raw: object) -> str:
    """A Spark checkpoint location as :func:`parse_optional_uri` takes it, ``s3a://`` (Spark's
    name for S3) included."""
    if isinstance(raw, str) and raw.strip().startswith("s3a://"):
        parse_uri("s3://" + raw.strip().removeprefix("s3a://"))
        return raw.strip()
    return parse_optional_uri(raw)


def parse_endpoint(raw: object) -> tuple[str, ...]:
    """Comma-separated gateway URLs, each ``http(s)://host[:port][/path]``."""
    endpoints = parse_list(raw)
    for url in endpoints:
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"endpoint {url!r}: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"endpoint {url!r} is not an http(s)://host[:port] URL")
        if port == 0 or parts.query or parts.fragment or parts.username or " " in url:
            raise ValueError(f"endpoint {url!r}: no port 0, query, fragment or user info")
    return endpoints


def parse_token(raw: object) -> str:
    """A bearer token: printable ASCII without spaces (it goes into an HTTP header)."""
    text = parse_str(raw)
    if len(text) > 4096 or not re.fullmatch(r"[\x21-\x7e]*", text):
        raise ValueError("a token is up to 4096 printable ASCII characters without spaces")
    return text


FailureStrategy = Literal["fallback", "fail"]
CompactionMode = Literal["background", "executor"]
Exchange = Literal["auto", "always", "never"]
Compression = Literal["zstd", "none"]  # the block codecs of snapshot.codec


def _choice(raw: object, choices: tuple[str, ...]) -> str:
    text = parse_str(raw)
    if text not in choices:
        raise ValueError(f"must be one of {', '.join(choices)}")
    return text


def parse_failure_strategy(raw: object) -> FailureStrategy:
    """``fallback`` or ``fail``: a Literal type, so mypy refuses a comparison with a typo."""
    return cast(FailureStrategy, _choice(raw, get_args(FailureStrategy)))


def parse_compaction_mode(raw: object) -> CompactionMode:
    """``background`` or ``executor`` (a Literal type, as above)."""
    return cast(CompactionMode, _choice(raw, get_args(CompactionMode)))


def parse_compression(raw: object) -> Compression:
    """``zstd`` or ``none`` (a Literal type, as above)."""
    return cast(Compression, _choice(raw, get_args(Compression)))


def parse_exchange(raw: object) -> Exchange:
    """``auto``, ``always`` or ``never`` (a Literal type, as above)."""
    return cast(Exchange, _choice(raw, get_args(Exchange)))


def parse_dirs(raw: object) -> tuple[str, ...]:
    """Comma-separated absolute directories."""
    dirs = parse_list(raw)
    for path in dirs:
        if not os.path.isabs(path):
            raise ValueError(f"{path!r} is a relative path; give an absolute directory")
    return dirs


# --------------------------------------------------------------------------- validators


def zero_or_between(low: float, high: float) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        ok = value == 0 or low <= value <= high
        return None if ok else f"must be 0 or between {_human(low)} and {_human(high)}"

    return check


def _human(value: float) -> str:
    for unit, size in (("t", 1 << 40), ("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10)):
        if value >= size and value % size == 0:
            return f"{int(value // size)}{unit}"
    return f"{value:g}"


def sizes_between(low: int, high: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        ok = low <= value <= high
        return None if ok else f"must be between {_human(low)} and {_human(high)}"

    return check


def at_least(low: float) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value >= low else f"must be at least {low:g}"

    return check


def between(low: float, high: float) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if low <= value <= high else f"must be between {low:g} and {high:g}"

    return check


def ip_address_or_empty(value: Any) -> str | None:
    """An IP address literal (a listening address is never a name to resolve), or empty."""
    if value == "":
        return None
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return "must be an IP address (such as 10.0.0.5 or ::1) or empty"
    return None


# --------------------------------------------------------------------------- the schema


@dataclasses.dataclass(frozen=True)
class Setting(Generic[T]):
    """One configuration setting: how it is named in every source, typed and checked."""

    name: str
    type_name: str
    parser: Callable[[object], T]
    default: T
    meaning: str
    validate: Callable[[T], str | None] | None = None

    @property
    def env_var(self) -> str:
        """``spill.dirs`` -> ``STATETIER_SPILL_DIRS``."""
        return ENV_PREFIX + re.sub(r"[.\-]", "_", self.name).upper()

    @property
    def spark_key(self) -> str:
        """``spill.dirs`` -> ``spark.statetier.spill.dirs``."""
        return SPARK_PREFIX + self.name

    @property
    def field(self) -> str:
        """The attribute name on :class:`StatetierConfig`: ``spill.dirs`` -> ``spill_dirs``."""
        return re.sub(r"[.\-]", "_", self.name)

    def parse(self, raw: object, source: str) -> T:
        """Parse and validate ``raw``; ``source`` says where it came from, for the error."""
        try:
            value = self.parser(raw)
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"{source}={raw!r} (setting {self.name}): {exc or 'invalid ' + self.type_name}"
            ) from None
        problem = self.validate(value) if self.validate else None
        if problem:
            raise ConfigError(f"{source}={raw!r} (setting {self.name}): {problem}")
        return value

    def render_default(self) -> str:
        if isinstance(self.default, tuple):
            return ",".join(self.default) or "(empty)"
        if isinstance(self.default, bool):
            return str(self.default).lower()
        if self.default == "" or self.default is None:
            return "(empty)"
        return str(self.default)


SETTINGS: tuple[Setting[Any], ...] = (
    Setting(
        "checkpoint.uri",
        "uri",
        parse_uri,
        "file://./statetier-checkpoints",
        "Where epoch checkpoints are written: s3://bucket/prefix, file:///absolute/path or "
        "memory://name. The default, file://./ (the one relative form accepted), is the working "
        "directory: local to each pod, for a laptop only.",
    ),
    Setting(
        "checkpoint.restore-from",
        "uri",
        parse_optional_uri,
        "",
        "A savepoint (statetier checkpoint savepoint) to start from when checkpoint.uri holds no "
        "committed epoch yet: its state is copied into checkpoint.uri, at any parallelism, and "
        "the savepoint is never written. Ignored (logged) once checkpoint.uri has epochs. "
        "Empty: start empty.",
    ),
    Setting(
        "checkpoint.spark-uri",
        "uri",
        parse_optional_spark_uri,
        "",
        "The query's Spark checkpoint location (s3a:// too), for the application to pass to "
        "checkpointLocation: statetier does not read it. The operator sets it from the "
        "statetier.io/spark-checkpoint-uri annotation and moves it on an upgrade "
        "(statetier.io/upgrade-mode savepoint or stateless). Empty: the application's own.",
    ),
    Setting(
        "checkpoint.retained",
        "int",
        parse_int,
        3,
        "How many committed epochs are kept; files only older epochs reference are deleted.",
        between(1, 10000),
    ),
    Setting(
        "checkpoint.incremental",
        "bool",
        parse_bool,
        True,
        "Write only what changed since the previous epoch as delta files.",
    ),
    Setting(
        "checkpoint.compression",
        "enum",
        parse_compression,
        "zstd",
        "How the blocks of keyed data files are compressed: zstd (level 1; a third of the "
        "bytes of a word count's state, fewer bytes for the object store to take in, merge and "
        "serve) or none (the format of statetier before compression, which older versions "
        "read). Either is read back whatever this says.",
    ),
    Setting(
        "checkpoint.upload-concurrency",
        "int",
        parse_int,
        4,
        "Data files uploaded in parallel while processing goes on.",
        between(1, 64),
    ),
    Setting(
        "state.max-parallelism",
        "int",
        parse_int,
        0,
        "Number of key groups (max parallelism). 0 derives it from the parallelism as Flink does "
        "(1.5x rounded up to a power of two, within 128..32768). Fixed once checkpointed.",
        between(0, 32768),
    ),
    Setting(
        "spill.dirs",
        "list",
        parse_dirs,
        (),
        "Comma-separated absolute directories on local SSD for spilled key groups, used in "
        "rotation. Empty: the executor's local dirs, else the system temp dir.",
    ),
    Setting(
        "memory.budget",
        "size",
        parse_size,
        0,
        "Memory the state may use in this process; on Spark, in each executor, split evenly "
        "across its state hosts (host.per-executor). 0: the container limit (cgroup), else "
        "physical memory. Otherwise 1m to 1024t.",
        zero_or_between(1 << 20, 1 << 50),
    ),
    Setting(
        "memory.runtime-allowance",
        "size",
        parse_size,
        256 << 20,
        "Memory the process's runtime (Python, Arrow, a batch's working memory) may take beside "
        "memory.budget: the process stays within budget plus this allowance, and spills state "
        "when its RSS would pass them. The operator reserves it in the executor pod.",
        zero_or_between(1 << 20, 1 << 50),
    ),
    Setting(
        "spill.threshold",
        "fraction",
        parse_float,
        0.5,
        "Spill cold key groups when memory use passes this fraction of the budget.",
        between(0.05, 1.0),
    ),
    Setting(
        "spill.load-threshold",
        "fraction",
        parse_float,
        0.3,
        "Load spilled key groups back when memory use falls below this fraction of the budget.",
        between(0.0, 1.0),
    ),
    Setting(
        "spill.ratio",
        "fraction",
        parse_float,
        0.2,
        "Share of heap state spilled in one step.",
        between(0.01, 1.0),
    ),
    Setting(
        "spill.gc-pause-threshold",
        "duration",
        parse_duration,
        0.0,
        "Spill when the average gen-2 GC pause over the window passes this. 0 disables it.",
        between(0, 3600),
    ),
    Setting(
        "spill.check-interval",
        "duration",
        parse_duration,
        1.0,
        "How often the memory monitor checks usage.",
        between(0.01, 3600),
    ),
    Setting(
        "spill.enabled",
        "bool",
        parse_bool,
        False,
        "Run the memory monitor and spill cold key groups to the spill dirs under pressure.",
    ),
    Setting(
        "spill.gc-window",
        "duration",
        parse_duration,
        60.0,
        "Window over which gen-2 GC pauses are averaged for spill.gc-pause-threshold.",
        between(0.01, 86400),
    ),
    Setting(
        "spill.size-weight",
        "fraction",
        parse_float,
        0.5,
        "Weight of key-group size against request rate when choosing what to spill or load.",
        between(0.0, 1.0),
    ),
    Setting(
        "spill.chunk-size",
        "size",
        parse_size,
        64 << 20,
        "Size of one mmap'd chunk file in a spill dir; space is reserved when it is created. "
        "64k to 1g.",
        sizes_between(1 << 16, 1 << 30),
    ),
    Setting(
        "compaction.endpoints",
        "list",
        parse_endpoint,
        (),
        "Comma-separated http(s)://host[:port] URLs of compaction gateways. Empty: compact "
        "locally.",
    ),
    Setting(
        "compaction.timeout",
        "duration",
        parse_duration,
        300.0,
        "How long a remote compaction may take before the failure strategy applies.",
        between(1, 86400),
    ),
    Setting(
        "compaction.failure-strategy",
        "enum",
        parse_failure_strategy,
        "fallback",
        "What to do when remote compaction fails: fallback (compact locally) or fail.",
    ),
    Setting(
        "compaction.retries",
        "int",
        parse_int,
        2,
        "Further attempts (on the next endpoint) after a remote compaction fails on the service "
        "side, all within compaction.timeout.",
        between(0, 20),
    ),
    Setting(
        "compaction.poll-interval",
        "duration",
        parse_duration,
        0.5,
        "How often a waiting client polls its remote compaction job (how fast it notices a "
        "gateway that died or lost the job).",
        between(0.01, 60),
    ),
    Setting(
        "compaction.token",
        "secret",
        parse_token,
        "",
        "Shared bearer token of the compaction service (client, gateway and workers; printable "
        "ASCII, no spaces). Empty: none (a gateway then refuses its API unless it runs "
        "--insecure-no-token). Prefer the environment variable to a Spark conf key for a secret.",
    ),
    Setting(
        "compaction.mode",
        "enum",
        parse_compaction_mode,
        "background",
        "Where chains of deltas are merged into new bases. background: after each commit, off "
        "the epoch's path, on the compaction service when compaction.endpoints is set, else in "
        "the process that commits (the Spark driver, the local runner). executor (Spark only, "
        "to compare): the state host writes a full base inside its snapshot once a chain is "
        "longer than compaction.delta-trigger.",
    ),
    Setting(
        "compaction.delta-trigger",
        "int",
        parse_int,
        5,
        "Compact a range when this many delta files pile up on its base.",
        between(1, 1000),
    ),
    Setting(
        "compaction.size-ratio",
        "fraction",
        parse_float,
        1.0,
        "Compact a range when its delta files add up to this fraction of its base's size.",
        between(0.01, 1e6),
    ),
    Setting(
        "host.idle-timeout",
        "duration",
        parse_duration,
        600.0,
        "Spark: how long an executor's state host keeps its warm key-group ranges without a "
        "task before it exits (state is then restored from the checkpoint).",
        between(1, 7 * 86400),
    ),
    Setting(
        "host.stopped-query-timeout",
        "duration",
        parse_duration,
        60.0,
        "Spark: how long the state hosts keep a stopped streaming query's ranges warm for a "
        "restart before they drop them (a later restart restores them from the checkpoint). "
        "Classic driver; on Spark Connect they are dropped when the query stops.",
        between(0, 7 * 86400),
    ),
    Setting(
        "host.result-timeout",
        "duration",
        parse_duration,
        600.0,
        "Spark: how long the driver waits, after an epoch's job finished, for every range's "
        "snapshot (a state host writes it after its task returned); past it the epoch fails "
        "uncommitted and is re-run on restart. Bound it by the longest snapshot upload.",
        between(1, 7 * 86400),
    ),
    Setting(
        "host.liveness-timeout",
        "duration",
        parse_duration,
        10.0,
        "Spark: a state host that sends the driver no heartbeat (one a second) for this long is "
        "taken as gone and its key-group ranges get new owners. A host whose process ends is "
        "noticed at once, without waiting for this.",
        at_least(1),
    ),
    Setting(
        "host.bind-address",
        "str",
        parse_str,
        "",
        "Spark: the address an executor's state host listens on for tasks of other executors. "
        "Empty: the pod's IP on Kubernetes, else the address that routes to the driver; with a "
        "local master, 127.0.0.1. Never a wildcard unless set so.",
        ip_address_or_empty,
    ),
    Setting(
        "host.port",
        "int",
        parse_int,
        0,
        "Spark: the TCP port of each executor's state host (0: any free port). Set a fixed port "
        "to open it in a NetworkPolicy between executor pods.",
        between(0, 65535),
    ),
    Setting(
        "host.registry-port",
        "int",
        parse_int,
        0,
        "Spark: the TCP port of the driver's host registry, which state hosts register with and "
        "tasks ask for their range's owner (0: any free port). Set a fixed port to open it in a "
        "NetworkPolicy from executor pods to the driver.",
        between(0, 65535),
    ),
    Setting(
        "host.per-executor",
        "int",
        parse_int,
        0,
        "Spark: state hosts per executor, each its own process (one core) owning its own "
        "key-group ranges. 0: one per task slot (executor cores / spark.task.cpus; K of "
        "local[K]). 1: one host per executor. The executor's memory.budget is split evenly "
        "across its hosts.",
        between(0, 256),
    ),
    Setting(
        "host.rebalance-moves",
        "int",
        parse_int,
        4,
        "Spark: at most this many key-group ranges move per epoch (between micro-batches, "
        "after the commit) to spread the ranges evenly over the live state hosts when hosts "
        "joined (a new executor). A moved range's state goes from its old host to the new one "
        "when the old one is alive, else it is restored from the checkpoint. 0: ranges move "
        "only when their host is gone.",
        between(0, 4096),
    ),
    Setting(
        "pipeline.exchange",
        "enum",
        parse_exchange,
        "auto",
        "Spark: how a micro-batch's records reach their key-group ranges. auto: without "
        "Spark's exchange once every executor has its state host: each task of the "
        "micro-batch sends its piece of every range to the range's state host, which runs "
        "the range once it has every piece (one partition: its one task sends it all); a "
        "combiner that aggregates in Spark SQL takes the exchange. always: the exchange every "
        "time, one task per range, and a write_stream query planned once. never: as auto "
        "from the first micro-batch on, and a combiner's micro-batch is read by one task.",
    ),
    Setting(
        "metrics.port",
        "int",
        parse_int,
        0,
        "Port of the Prometheus metrics endpoint in this process. 0 disables it.",
        between(0, 65535),
    ),
)

_BY_NAME = {setting.name: setting for setting in SETTINGS}
_BY_FIELD = {setting.field: setting for setting in SETTINGS}


@dataclasses.dataclass(frozen=True, repr=False)
class StatetierConfig(Mapping[str, Any]):
    """Resolved settings, as typed attributes (``cfg.spill_dirs``) or by name
    (``cfg["spill.dirs"]``).

    Immutable; made by :func:`load_config`, which parses and validates every value. One field per
    :data:`SETTINGS` entry, declared with the type its parser returns, so ``mypy --strict``
    refuses a misspelled or mistyped setting (``cfg.spil_dirs``); a test keeps the fields and
    the schema in step.
    """

    checkpoint_uri: str
    checkpoint_restore_from: str
    checkpoint_spark_uri: str
    checkpoint_retained: int
    checkpoint_incremental: bool
    checkpoint_compression: Compression
    checkpoint_upload_concurrency: int
    state_max_parallelism: int
    spill_dirs: tuple[str, ...]
    memory_budget: int
    memory_runtime_allowance: int
    spill_threshold: float
    spill_load_threshold: float
    spill_ratio: float
    spill_gc_pause_threshold: float
    spill_check_interval: float
    spill_enabled: bool
    spill_gc_window: float
    spill_size_weight: float
    spill_chunk_size: int
    compaction_endpoints: tuple[str, ...]
    compaction_timeout: float
    compaction_failure_strategy: FailureStrategy
    compaction_retries: int
    compaction_poll_interval: float
    compaction_token: str
    compaction_mode: CompactionMode
    compaction_delta_trigger: int
    compaction_size_ratio: float
    host_idle_timeout: float
    host_stopped_query_timeout: float
    host_result_timeout: float
    host_liveness_timeout: float
    host_bind_address: str
    host_port: int
    host_registry_port: int
    host_per_executor: int
    host_rebalance_moves: int
    pipeline_exchange: Exchange
    metrics_port: int
    sources: Mapping[str, str] = dataclasses.field(
        default_factory=dict, compare=False, kw_only=True
    )
    """Where each value came from, by setting name (see :meth:`source`); not a setting."""

    def __getitem__(self, name: str) -> Any:
        setting = _BY_NAME.get(name)
        if setting is None:
            raise KeyError(name)
        return getattr(self, setting.field)

    def __iter__(self) -> Iterator[str]:
        return iter(_BY_NAME)

    def __len__(self) -> int:
        return len(_BY_NAME)

    def source(self, name: str) -> str:
        """Where the value came from: ``default``, ``env``, ``spark`` or ``code``."""
        return self.sources.get(name, "code")

    def as_env(self) -> dict[str, str]:
        """The settings as environment variables, as the operator writes them."""
        return {_BY_NAME[n].env_var: _render(v) for n, v in self.items()}

    def __repr__(self) -> str:
        body = ", ".join(f"{name}={value!r}" for name, value in self.items())
        return f"StatetierConfig({body})"


def _render(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def load_config(
    overrides: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    spark_conf: Mapping[str, str] | None = None,
) -> StatetierConfig:
    """Resolve every setting: code ``overrides`` > ``spark_conf`` > ``env`` > default.

    ``overrides`` takes setting names (``"spill.dirs"``) or field names (``"spill_dirs"``).
    ``env`` defaults to ``os.environ``. Unknown ``statetier`` keys in any source are errors, so a
    typo never silently falls back to a default.
    """
    env = os.environ if env is None else env
    spark_conf = spark_conf or {}
    overrides = _normalize_overrides(overrides or {})
    _reject_unknown(env, spark_conf)
    for warning in misspelled_prefixes(env, spark_conf):
        log.warning(warning)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for setting in SETTINGS:
        if setting.name in overrides:
            values[setting.name] = setting.parse(overrides[setting.name], setting.name)
            sources[setting.name] = "code"
        elif setting.spark_key in spark_conf:
            raw = spark_conf[setting.spark_key]
            values[setting.name] = setting.parse(raw, setting.spark_key)
            sources[setting.name] = "spark"
        elif setting.env_var in env:
            values[setting.name] = setting.parse(env[setting.env_var], setting.env_var)
            sources[setting.name] = "env"
        else:
            values[setting.name] = setting.default
            sources[setting.name] = "default"
    _check_consistency(values)
    fields = {_BY_NAME[name].field: value for name, value in values.items()}
    return StatetierConfig(**fields, sources=sources)


def warn_if_spill_off(config: StatetierConfig, logger: logging.Logger) -> None:
    """Log :func:`spill_off_warning` on ``logger`` if there is one: what the runtimes do once
    when they start (the driver, a state host per pipeline, a LocalRunner)."""
    warning = spill_off_warning(config)
    if warning:
        logger.warning(warning)


def spill_off_warning(config: StatetierConfig) -> str | None:
    """Why a configuration that asks for the spill tier's parts will not spill, or None.

    ``spill.enabled`` is off by default: spilling writes to local disk, which the user (or the
    operator, which switches it on with the volume it provisions) chooses. Spill dirs and a
    budget without the switch are a configuration that looks complete and does nothing, so the
    runtimes say so when they start instead of letting state grow past the budget silently.
    """
    if config.spill_enabled or not config.spill_dirs or not config.memory_budget:
        return None
    enable = _BY_NAME["spill.enabled"]
    return (
        f"spill.dirs ({','.join(config.spill_dirs)}) and memory.budget "
        f"({config.memory_budget} bytes) are set but spill.enabled is false: state stays on "
        f"the heap past the budget and nothing spills; set {enable.spark_key}=true "
        f"(or {enable.env_var}=true) to spill"
    )


def _normalize_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
    normalized: dict[str, Any] = {}
    for key, value in overrides.items():
        setting = _BY_NAME.get(key) or _BY_FIELD.get(key)
        if setting is None:
            raise ConfigError(
                f"unknown setting {key!r}{_did_you_mean(key, [*_BY_NAME, *_BY_FIELD])}"
            )
        normalized[setting.name] = value
    return normalized


def _reject_unknown(env: Mapping[str, str], spark_conf: Mapping[str, str]) -> None:
    known_env = {s.env_var for s in SETTINGS}
    known_spark = {s.spark_key for s in SETTINGS}
    for key in env:
        if key.startswith(ENV_PREFIX) and key not in known_env and not _is_reserved_env(key):
            raise ConfigError(f"unknown environment variable {key}{_did_you_mean(key, known_env)}")
    for key in spark_conf:
        if key.startswith(SPARK_PREFIX) and key not in known_spark:
            raise ConfigError(f"unknown Spark conf key {key}{_did_you_mean(key, known_spark)}")


def misspelled_prefixes(env: Mapping[str, str], spark_conf: Mapping[str, str]) -> list[str]:
    """A warning for each key that looks meant for statetier but misses its prefix
    (``spark.statetiers.checkpoint.uri``, ``STATETIERS_CHECKPOINT_URI``): such a key is
    someone else's to Spark, so it would be ignored without a word and the setting would keep
    its default (for ``checkpoint.uri``, the working directory)."""
    known_spark = {s.spark_key for s in SETTINGS}
    known_env = {s.env_var for s in SETTINGS}
    found = [
        (key, "Spark conf key", SPARK_PREFIX, known_spark)
        for key in spark_conf
        if _near_prefix(key, ".", SPARK_PREFIX)
    ]
    found += [
        (key, "environment variable", ENV_PREFIX, known_env)
        for key in env
        if _near_prefix(key, "_", ENV_PREFIX)
    ]
    return [
        f"{what} {key} is not a statetier setting and is ignored (its prefix is not "
        f"{prefix}){_did_you_mean(_respelled(key, prefix), known)}"
        for key, what, prefix, known in found
    ]


def _head(key: str, separator: str, parts: int) -> str:
    return separator.join(key.split(separator)[:parts])


def _near_prefix(key: str, separator: str, prefix: str) -> bool:
    """Whether ``key`` starts with a near miss of ``prefix`` (not with ``prefix`` itself)."""
    parts = prefix.count(separator)
    head, want = _head(key, separator, parts).lower(), prefix[:-1].lower()
    if key.startswith(prefix) or key.count(separator) < parts:
        return False
    return head != want and difflib.SequenceMatcher(None, head, want).ratio() >= 0.85


def _respelled(key: str, prefix: str) -> str:
    """``key`` with its near-miss prefix replaced by ``prefix``."""
    separator = prefix[-1]
    return prefix + key.split(separator, prefix.count(separator))[-1]


def _did_you_mean(key: str, known: Iterable[str]) -> str:
    """The closest known name, for an unknown-key error (a typo is the usual cause)."""
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"{hint} (`statetier config docs` lists every setting)"


def _is_reserved_env(key: str) -> bool:
    """Variables under the prefix that are not settings (test and tool switches)."""
    return key.startswith(ENV_PREFIX + "TEST_") or key.startswith(ENV_PREFIX + "BENCH_")


def _check_consistency(values: Mapping[str, Any]) -> None:
    load, spill = values["spill.load-threshold"], values["spill.threshold"]
    if load >= spill:
        raise ConfigError(
            f"spill.load-threshold ({load}) must be below spill.threshold ({spill}), "
            "or spilled key groups would be loaded back at once"
        )


def render_markdown(settings: Sequence[Setting[Any]] = SETTINGS) -> str:
    """The configuration reference page (``docs/configuration.md``)."""
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `statetier config docs` from statetier.backend.config; "
        "a test keeps it in sync. Do not edit by hand. -->",
        "",
        "Every setting can be given in code (`load_config({...})`), as a Spark conf key, or as "
        "an environment variable; that is also the order of precedence. The Kubernetes "
        "operator writes these exact keys. A bad value fails at start with an error that names "
        "the setting, the source and what is allowed. Unknown keys under `spark.statetier.` "
        "or `STATETIER_` are errors too.",
        "",
        "Sizes take binary units (`512m`, `2g`); durations take `ms`, `s`, `m`, `h` "
        "(plain numbers are seconds); lists are comma-separated.",
        "",
        "| setting | environment variable | Spark conf key | type | default | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for s in settings:
        lines.append(
            f"| `{s.name}` | `{s.env_var}` | `{s.spark_key}` | {s.type_name} | "
            f"`{s.render_default()}` | {s.meaning} |"
        )
    return "\n".join(lines) + "\n"
