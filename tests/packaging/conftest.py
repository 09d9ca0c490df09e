"""Fixtures of the packaging tests; the helpers are in packaging_support."""

from __future__ import annotations

import pytest

from tests.packaging.packaging_support import FlowResult, run_flow


@pytest.fixture(scope="session")
def clusterwide_flow(tmp_path_factory: pytest.TempPathFactory) -> FlowResult:
    """The operator integration flow with the chart's default values (all namespaces)."""
    return run_flow({}, tmp_path_factory.mktemp("flow-clusterwide"))
