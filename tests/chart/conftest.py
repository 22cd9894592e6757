"""Fixtures for the Helm chart checks (helpers in chartkit.py)."""

from __future__ import annotations

import pytest
from chart.chartkit import CHART


@pytest.fixture(scope="session")
def helm():
    """The helm_python module, or skip when helm-python-sdk is not installed."""
    return pytest.importorskip("helm_python", reason="helm-python-sdk not installed (pip install '.[dev]')")


@pytest.fixture(scope="session")
def chart(helm):
    return helm.Chart.load(str(CHART))


@pytest.fixture(scope="session")
def scrapes(tmp_path_factory) -> dict[str, str]:
    """One live scrape of clusterd, noded and deviced (real processes; chart/livescrape.py)."""
    import asyncio

    from chart.livescrape import scrape_all

    kmock = pytest.importorskip("kmock", reason="kmock not installed (pip install '.[dev]')")
    return asyncio.run(scrape_all(tmp_path_factory.mktemp("scrape"), kmock))
