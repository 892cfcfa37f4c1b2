"""Everything under tests/integration runs against the real local Kafka broker."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.support import Workers

#: partitions of the join apps' topics (tests/integration/apps/joiner.py)
JOIN_PARTITIONS = 6


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/tests/integration/" in str(item.path):
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def joiners(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> Iterator[Workers]:
    """Worker processes of the join test app, on fresh topics of this test."""
    env = {
        **os.environ,
        "SJT_APP_ID": unique_topic("join"),
        "SJT_BROKER": f"kafka://{kafka_bootstrap}",
        "SJT_IMPRESSIONS": unique_topic("imp"),
        "SJT_CLICKS": unique_topic("clk"),
        "SJT_OUTPUT": unique_topic("out"),
        "SJT_PARTITIONS": str(JOIN_PARTITIONS),
        "PYTHONUNBUFFERED": "1",
    }
    group = Workers("tests.integration.apps.joiner:app", env, tmp_path)
    yield group
    group.close()
