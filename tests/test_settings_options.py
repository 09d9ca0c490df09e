"""The services' settings style: each flag of ``statetier-compaction`` and ``statetier-operator
run`` is made from a field of a settings dataclass, so its default is the field's default, its
value is parsed and validated where the setting is declared, and a bad value is refused with a
line naming the flag."""

from __future__ import annotations

import pytest
from statetier.backend.options import from_options
from statetier.compaction import cli as compaction_cli
from statetier.compaction.gateway import GatewaySettings
from statetier.compaction.worker import WorkerSettings
from statetier.operator import cli as operator_cli
from statetier.operator.settings import OperatorSettings

PREFIX = ["--allowed-prefix", "file:///data"]


@pytest.fixture(autouse=True)
def _no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(compaction_cli.TOKEN_ENV, raising=False)


def test_without_flags_every_service_runs_with_its_settings_defaults() -> None:
    gateway = compaction_cli.build_parser().parse_args(["gateway", *PREFIX])
    assert compaction_cli._gateway_settings(gateway) == GatewaySettings(
        allowed_prefixes=("file:///data",)
    )
    worker = compaction_cli.build_parser().parse_args(["worker", *PREFIX, "--gateway", "http://g"])
    assert from_options(
        WorkerSettings, worker, allowed_prefixes=("file:///data",)
    ) == WorkerSettings(gateway="http://g", allowed_prefixes=("file:///data",))
    run = operator_cli.build_parser().parse_args(["run"])
    assert from_options(OperatorSettings, run) == OperatorSettings()


def test_flags_fill_the_settings_they_were_made_from() -> None:
    args = compaction_cli.build_parser().parse_args(
        [
            *("gateway", *PREFIX, "--max-job-bytes", "2g", "--scheduling-policy", "fifo"),
            *("--insecure-no-token", "--port", "0", "--lease-ttl", "4.5"),
        ]
    )
    settings = compaction_cli._gateway_settings(args)
    assert settings.limits.max_job_bytes == 2 << 30
    assert settings.scheduler.job_policy == "fifo" and settings.scheduler.lease_ttl == 4.5
    assert settings.insecure and settings.port == 0
    args = operator_cli.build_parser().parse_args(
        ["run", "-n", "a", "--namespace", "b", "--no-webhooks", "--metrics-port", "0"]
    )
    ours = from_options(OperatorSettings, args)
    assert ours.namespaces == ("a", "b") and not ours.webhooks and ours.metrics_port == 0
    assert ours.manage_webhook_configuration  # --no-manage-webhooks not given


def test_help_shows_the_settings_help_and_defaults() -> None:
    subcommands = compaction_cli.build_parser()._subparsers._group_actions[0]  # type: ignore[union-attr]
    help_text = " ".join(subcommands.choices["gateway"].format_help().split())  # type: ignore[index]
    assert "--lease-ttl LEASE_TTL seconds without heartbeat (default 10.0)" in help_text
    assert "--scheduling-policy {fifo,fair} which queued job goes next (default fair)" in help_text


def test_a_bad_value_is_refused_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        compaction_cli.main(["gateway", *PREFIX, "--max-job-bytes", "lots"])
    assert exited.value.code == 2
    assert "argument --max-job-bytes: 'lots': expected a size" in capsys.readouterr().err
    # validated where the setting is declared, before anything listens
    assert compaction_cli.main(["gateway", *PREFIX, "--lease-ttl", "0"]) == 2
    assert "lease-ttl must be in (0, 3600]" in capsys.readouterr().err
    worker = ["worker", *PREFIX, "--gateway", "http://g", "--concurrency", "0"]
    assert compaction_cli.main(worker) == 2
    assert "concurrency 0 is not between 1 and 1024" in capsys.readouterr().err
    assert operator_cli.main(["run", "--metrics-port", "70000"]) == 2
    err = capsys.readouterr().err
    assert err == "statetier-operator run: --metrics-port 70000 is not between 0 and 65535\n"
