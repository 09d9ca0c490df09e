"""The configuration schema: parsing, precedence, errors, and the generated reference page."""

from __future__ import annotations

from pathlib import Path

import pytest
from statetier.backend.config import SETTINGS, ConfigError, load_config, render_markdown

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
