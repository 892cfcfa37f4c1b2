"""Everything under tests/integration runs against the real local Kafka broker."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.support import Workers, counter_workers, join_workers

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
    group = join_workers(kafka_bootstrap, unique_topic, tmp_path, JOIN_PARTITIONS)
    yield group
    group.close()


@pytest.fixture
def counters(
    request: pytest.FixtureRequest,
    kafka_bootstrap: str,
    unique_topic: Callable[..., str],
    tmp_path: Path,
) -> Iterator[Workers]:
    """Worker processes of the counter test app, on fresh topics of this test, with the
    test module's ``PARTITIONS``."""
    group = counter_workers(kafka_bootstrap, unique_topic, tmp_path, request.module.PARTITIONS)
    yield group
    group.close()
