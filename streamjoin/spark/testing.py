"""One small SparkSession per test process (the JVM starts once), with the Kafka connector."""

from __future__ import annotations

import threading
from typing import Any

from streamjoin.spark.session import get_session

__all__ = ["shared_test_session"]

_TEST_CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "1g",
}
_lock = threading.Lock()
_session: Any = None


def shared_test_session() -> Any:
    """``local[2]`` with tiny shuffles and no UI: fast enough for unit tests."""
    global _session
    with _lock:
        if _session is not None:
            return _session
        conf = dict(_TEST_CONF)
        _session = get_session("local[2]", app_name="streamjoin-tests", conf=conf)
        return _session
