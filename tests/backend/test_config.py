"""The configuration schema: parsing, precedence, errors, and the generated reference page."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from statetier.backend.config import SETTINGS, ConfigError, load_config, render_markdown

SETTINGS_BY_NAME = {s.name: s for s in SETTINGS}

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_when_nothing_is_set() -> None:
    cfg = load_config(env={})
    assert cfg.spill_threshold == 0.5
    assert cfg.spill_dirs == ()
    assert cfg.source("spill.threshold") == "default"


def test_precedence_code_over_spark_over_env() -> None:
    env = {"STATETIER_SPILL_RATIO": "0.3", "STATETIER_CHECKPOINT_RETAINED": "7"}
    spark = {"spark.statetier.spill.ratio": "0.4"}
    cfg = load_config({"checkpoint.retained": 9}, env=env, spark_conf=spark)
    assert cfg.spill_ratio == 0.4 and cfg.source("spill.ratio") == "spark"
    assert cfg.checkpoint_retained == 9 and cfg.source("checkpoint.retained") == "code"
    assert load_config(env=env).spill_ratio == 0.3


def test_units_and_lists() -> None:
    env = {
        "STATETIER_MEMORY_BUDGET": "512m",
        "STATETIER_SPILL_DIRS": "/ssd0, /ssd1,",
        "STATETIER_COMPACTION_TIMEOUT": "1500ms",
        "STATETIER_CHECKPOINT_INCREMENTAL": "off",
    }
    cfg = load_config(env=env)
    assert cfg.memory_budget == 512 * 1024 * 1024
    assert cfg.spill_dirs == ("/ssd0", "/ssd1")
    assert cfg.compaction_timeout == 1.5
    assert cfg.checkpoint_incremental is False


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        (
            {"STATETIER_SPILL_THRESHOLD": "1.5"},
            "STATETIER_SPILL_THRESHOLD='1.5' (setting spill.threshold): must be between",
        ),
        ({"STATETIER_CHECKPOINT_RETAINED": "many"}, "STATETIER_CHECKPOINT_RETAINED='many'"),
        ({"STATETIER_COMPACTION_FAILURE_STRATEGY": "retry"}, "must be one of fallback, fail"),
        ({"STATETIER_MEMORY_BUDGET": "lots"}, "expected a size"),
        ({"STATETIER_SPIL_DIRS": "/x"}, "unknown environment variable STATETIER_SPIL_DIRS"),
        ({"STATETIER_SPILL_LOAD_THRESHOLD": "0.6"}, "must be below spill.threshold"),
    ],
)
def test_bad_values_name_the_setting(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        load_config(env=env)
    assert fragment in str(info.value)


def test_unknown_spark_key_and_override_are_errors() -> None:
    with pytest.raises(ConfigError, match=r"spark\.statetier\.spill\.dir\b"):
        load_config(env={}, spark_conf={"spark.statetier.spill.dir": "/x"})
    with pytest.raises(ConfigError, match="unknown setting 'spill_dir'"):
        load_config({"spill_dir": "/x"}, env={})


def test_every_setting_has_distinct_keys_and_a_valid_default() -> None:
    assert len({s.env_var for s in SETTINGS}) == len(SETTINGS)
    assert len({s.spark_key for s in SETTINGS}) == len(SETTINGS)
    for setting in SETTINGS:
        assert setting.meaning.endswith("."), setting.name
        assert setting.parse(setting.default, "default") == setting.default


def test_as_env_round_trips() -> None:
    cfg = load_config({"spill.dirs": ["/a", "/b"], "memory.budget": "1g"}, env={})
    assert load_config(env=cfg.as_env()) == cfg


def test_reference_page_is_generated_from_the_schema() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == render_markdown(), "run `make docs` to regenerate docs/configuration.md"


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("checkpoint.uri", "", "expected a URI"),  # the current directory
        ("checkpoint.uri", None, "expected a URI string, got NoneType"),
        ("checkpoint.uri", 42, "expected a URI string, got int"),
        ("checkpoint.uri", "checkpoints", "expected a URI"),
        ("checkpoint.uri", "/abs/without/scheme", "expected a URI"),
        ("checkpoint.uri", "ftp://host/x", "scheme 'ftp' is not one of s3, file, memory"),
        ("checkpoint.uri", "gopher://host/x", "scheme 'gopher'"),
        ("checkpoint.uri", "S3://bucket/x", "scheme 'S3'"),
        ("checkpoint.uri", "s3:/bucket", "expected a URI"),
        ("checkpoint.uri", "s3://", "valid bucket name"),
        ("checkpoint.uri", "s3:///bucket", "valid bucket name"),
        ("checkpoint.uri", "file://tmp/ckpt", "is a relative path"),
        ("checkpoint.uri", "file:///tmp/../etc", "'..' segments"),
        ("checkpoint.uri", "memory://", "expected memory://name"),
        # fsspec chains: data would land under the first part, where no compaction looks
        ("checkpoint.uri", "file:///a::file:/b", "'::' chains two locations"),
        ("checkpoint.uri", "s3://bucket/p::file:/x", "'::' chains two locations"),
        ("compaction.endpoints", "not a url", "is not an http(s)://host[:port] URL"),
        ("compaction.endpoints", "http://gw:8080, ftp://gw", "'ftp://gw' is not an http(s)"),
        ("compaction.endpoints", "http://gw:99999", "Port out of range"),
        ("compaction.endpoints", "http://gw:0", "no port 0"),
        ("compaction.endpoints", "http://:8080", "is not an http(s)"),
        ("compaction.token", "two words", "without spaces"),
        ("memory.budget", "1.5", "a fraction of a byte"),
        ("memory.budget", "0.5k", "must be 0 or between 1m and 1024t"),
        ("memory.budget", "512", "must be 0 or between 1m and 1024t"),
        ("memory.budget", -1, "must be 0 or between"),
        ("memory.budget", "\u0664\u0662m", "ASCII digits"),  # Arabic-Indic 42
        ("memory.budget", 1.5e9, "expected a size such as 512m, got float"),
        ("spill.chunk-size", "1t", "must be between 64k and 1g"),
        ("spill.chunk-size", 2**70, "must be between 64k and 1g"),
        ("spill.chunk-size", "1k", "must be between 64k and 1g"),
        ("spill.dirs", "relative/spill", "is a relative path"),
        ("checkpoint.retained", "\u0663", "ASCII digits"),
        ("checkpoint.retained", "1e3", "ASCII digits"),
        ("checkpoint.retained", 10**9, "must be between 1 and 10000"),
        ("spill.threshold", "nan", "expected a number in ASCII digits"),
        ("spill.threshold", float("inf"), "expected a finite number"),
        ("spill.threshold", 10**400, "expected a finite number"),
        ("compaction.timeout", "inf", "expected a duration"),
        ("compaction.timeout", "9" * 400, "expected a finite number"),
        ("compaction.timeout", "\u0661\u0660s", "ASCII digits"),
        ("compaction.delta-trigger", 10**6, "must be between 1 and 1000"),
        ("host.result-timeout", "30d", "expected a duration"),
        ("host.bind-address", "executor-1.example", "must be an IP address"),
        ("host.port", "65536", "must be between 0 and 65535"),
        ("host.registry-port", -1, "must be between 0 and 65535"),
        ("host.liveness-timeout", "0s", "must be"),
    ],
)
def test_every_bad_value_is_refused_with_a_named_error(
    name: str, value: object, fragment: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config({name: value}, env={})
    message = str(info.value)
    assert f"(setting {name})" in message and fragment in message, message
    env_name = SETTINGS_BY_NAME[name].env_var
    if isinstance(value, str):  # the same value from the environment: the same refusal
        with pytest.raises(ConfigError, match=re.escape(f"{env_name}={value!r}")):
            load_config(env={env_name: value})


@pytest.mark.parametrize(
    ("name", "value", "parsed"),
    [
        ("checkpoint.uri", "s3://bucket/prefix/app", "s3://bucket/prefix/app"),
        ("checkpoint.uri", "file:///var/lib/ckpt", "file:///var/lib/ckpt"),
        ("checkpoint.uri", "file://./here", "file://./here"),
        ("checkpoint.uri", "memory://t1", "memory://t1"),
        (
            "compaction.endpoints",
            "http://gw:8080, https://gw2/base",
            ("http://gw:8080", "https://gw2/base"),
        ),
        ("memory.budget", "1.5g", 3 << 29),
        ("memory.budget", "64KiB", None),  # below the minimum: refused (see above)
        ("memory.budget", "1m", 1 << 20),
        ("memory.budget", 0, 0),
        ("spill.chunk-size", "64k", 1 << 16),
        ("checkpoint.retained", " 7 ", 7),
        ("spill.threshold", "5e-1", 0.5),
        ("compaction.timeout", "1.5m", 90.0),
    ],
)
def test_good_values_still_parse(name: str, value: object, parsed: object) -> None:
    if parsed is None:
        with pytest.raises(ConfigError):
            load_config({name: value}, env={})
        return
    assert load_config({name: value}, env={})[name] == parsed


def test_spill_dirs_and_a_budget_with_the_spill_tier_off_are_named_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The tier's parts without its switch do nothing: the runtime says so when it starts,
    naming the key that switches it on; with the switch, or without a budget, it says nothing."""
    from statetier.backend.config import spill_off_warning
    from statetier.backend.functions import KeyedProcessFunction
    from statetier.backend.local_runner import LocalRunner

    class Nothing(KeyedProcessFunction[str, int, int]):
        def process(self, key: str, value: int, context: Any) -> Iterable[int]:
            return ()

    parts = {"spill.dirs": str(tmp_path / "spill"), "memory.budget": "4m"}
    warning = spill_off_warning(load_config(parts, env={}))
    assert warning is not None
    assert "spill.enabled is false" in warning and "spark.statetier.spill.enabled=true" in warning
    assert spill_off_warning(load_config({**parts, "spill.enabled": True}, env={})) is None
    assert spill_off_warning(load_config({"spill.dirs": str(tmp_path)}, env={})) is None
    config = load_config({**parts, "checkpoint.uri": f"file://{tmp_path}/ckpt"}, env={})
    with caplog.at_level("WARNING", logger="statetier.local_runner"):
        LocalRunner(Nothing, 1, config=config).close()
    assert [r.message for r in caplog.records if "spill.enabled is false" in r.message]
