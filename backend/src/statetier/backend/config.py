"""The one configuration schema of statetier.

Every setting the backend reads is declared here once, with its name, environment variable,
Spark conf key, type, default, meaning and validation. The Kubernetes operator writes exactly
these keys (it imports this module), and ``docs/configuration.md`` is generated from it, so the
three can never drift apart. The module imports nothing from Spark on purpose: the operator and
the compaction service load it without Spark installed.

Sources, highest precedence first: values passed in code, Spark conf, environment, default.
A bad value raises :class:`ConfigError` naming the setting, where the value came from and what
is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

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


class ConfigError(ValueError):
    """A configuration value is missing, malformed or out of range."""


# --------------------------------------------------------------------------- value parsers
# Each parser takes the raw text (or an already-typed value passed in code) and returns the
# typed value, or raises ValueError with a short reason; Setting.parse adds the context.

_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_int(raw: object) -> int:
    if isinstance(raw, bool):
        raise ValueError("expected an integer, got a boolean")
    if isinstance(raw, int):
        return raw
    return int(str(raw).strip())


def parse_float(raw: object) -> float:
    if isinstance(raw, bool):
        raise ValueError("expected a number, got a boolean")
    if isinstance(raw, (int, float)):
        return float(raw)
    return float(str(raw).strip())


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


def parse_size(raw: object) -> int:
    """Bytes, with an optional binary unit: ``512m``, ``2g``, ``1073741824``, ``64KiB``."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower().replace("ib", "").replace("i", "")
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgtb]?)b?", text)
    if not match:
        raise ValueError("expected a size such as 512m, 2g or a number of bytes")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])


def parse_duration(raw: object) -> float:
    """Seconds, with an optional unit: ``500ms``, ``30s``, ``5m``, ``1h``, ``2.5``."""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return float(raw)
    text = str(raw).strip().lower()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s|min|m|h)?", text)
    if not match:
        raise ValueError("expected a duration such as 500ms, 30s or 5m")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]


# --------------------------------------------------------------------------- validators


def at_least(low: float) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value >= low else f"must be at least {low:g}"

    return check


def between(low: float, high: float) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if low <= value <= high else f"must be between {low:g} and {high:g}"

    return check


def one_of(*choices: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value in choices else f"must be one of {', '.join(choices)}"

    return check


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
        parse_str,
        "file://./statetier-checkpoints",
        "Where epoch checkpoints are written (s3://bucket/prefix, file:///path or memory://).",
    ),
    Setting(
        "checkpoint.retained",
        "int",
        parse_int,
        3,
        "How many committed epochs are kept; files only older epochs reference are deleted.",
        at_least(1),
    ),
    Setting(
        "checkpoint.incremental",
        "bool",
        parse_bool,
        True,
        "Write only what changed since the previous epoch as delta files.",
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
        parse_list,
        (),
        "Comma-separated directories on local SSD for spilled key groups, used in rotation. "
        "Empty: the executor's local dirs, else the system temp dir.",
    ),
    Setting(
        "memory.budget",
        "size",
        parse_size,
        0,
        "Memory the state may use in this process. 0: the container limit (cgroup), else "
        "physical memory.",
        at_least(0),
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
        at_least(0),
    ),
    Setting(
        "spill.check-interval",
        "duration",
        parse_duration,
        1.0,
        "How often the memory monitor checks usage.",
        at_least(0.01),
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
        at_least(0.01),
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
        "Size of one mmap'd chunk file in a spill dir; space is reserved when it is created.",
        at_least(1 << 16),
    ),
    Setting(
        "compaction.endpoints",
        "list",
        parse_list,
        (),
        "Comma-separated URLs of compaction gateways. Empty: compact locally.",
    ),
    Setting(
        "compaction.timeout",
        "duration",
        parse_duration,
        300.0,
        "How long a remote compaction may take before the failure strategy applies.",
        at_least(1),
    ),
    Setting(
        "compaction.failure-strategy",
        "enum",
        parse_str,
        "fallback",
        "What to do when remote compaction fails: fallback (compact locally) or fail.",
        one_of("fallback", "fail"),
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
        parse_str,
        "",
        "Shared bearer token of the compaction service (client, gateway and workers). Empty: "
        "none. Prefer the environment variable to a Spark conf key for a secret.",
    ),
    Setting(
        "compaction.delta-trigger",
        "int",
        parse_int,
        5,
        "Compact a range when this many delta files pile up on its base.",
        at_least(1),
    ),
    Setting(
        "compaction.size-ratio",
        "fraction",
        parse_float,
        1.0,
        "Compact a range when its delta files add up to this fraction of its base's size.",
        at_least(0.01),
    ),
    Setting(
        "host.idle-timeout",
        "duration",
        parse_duration,
        600.0,
        "Spark: how long an executor's state host keeps its warm key-group ranges without a "
        "task before it exits (state is then restored from the checkpoint).",
        at_least(1),
    ),
    Setting(
        "host.result-timeout",
        "duration",
        parse_duration,
        600.0,
        "Spark: how long the driver waits, after an epoch's job finished, for every range's "
        "snapshot (a state host writes it after its task returned); past it the epoch fails "
        "uncommitted and is re-run on restart. Bound it by the longest snapshot upload.",
        at_least(1),
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


class StatetierConfig(Mapping[str, Any]):
    """Resolved settings, as attributes (``cfg.spill_dirs``) or by name (``cfg["spill.dirs"]``).

    Immutable; every value has been parsed and validated.
    """

    def __init__(self, values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
        self._values = dict(values)
        self._sources = dict(sources)

    def __getattr__(self, field: str) -> Any:
        setting = _BY_FIELD.get(field)
        if setting is None:
            raise AttributeError(f"no setting has the field {field!r}")
        return self._values[setting.name]

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def source(self, name: str) -> str:
        """Where the value came from: ``default``, ``env``, ``spark`` or ``code``."""
        return self._sources[name]

    def as_env(self) -> dict[str, str]:
        """The settings as environment variables, as the operator writes them."""
        return {_BY_NAME[n].env_var: _render(v) for n, v in self._values.items()}

    def __repr__(self) -> str:
        body = ", ".join(f"{name}={value!r}" for name, value in self._values.items())
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
    return StatetierConfig(values, sources)


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
