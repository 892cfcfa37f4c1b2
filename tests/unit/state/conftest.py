"""Store fixtures: every contract test runs against both backends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from state_store_support import BACKENDS, StoreFactory

from streamjoin.state.base import StorePartition


@pytest.fixture(params=BACKENDS)
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    factory = StoreFactory(request.param, tmp_path)
    yield factory
    factory.close_all()


@pytest.fixture
def store(store_factory: StoreFactory) -> StorePartition:
    return store_factory.fresh()
