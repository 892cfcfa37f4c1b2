"""One small SparkSession per test process (the JVM starts once), with the Kafka connector.

When the connector release matching the installed PySpark is not on Maven Central
(PySpark 4.3.0 at the time of writing) and ``STREAMJOIN_SPARK_KAFKA_PACKAGES`` is
unset, this falls back to the newest published connector plus the last published
token-provider jar, which work on 4.3.0; production users set the coordinates
explicitly (docs/spark.md).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from streamjoin.spark.session import KAFKA_PACKAGES_ENV, default_kafka_packages, get_session

__all__ = ["FALLBACK_KAFKA_CONF", "shared_test_session"]

_MAVEN = "https://repo1.maven.org/maven2/org/apache/spark"
FALLBACK_KAFKA_CONF = {
    "spark.jars.packages": "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0",
    "spark.jars.excludes": "org.apache.spark:spark-token-provider-kafka-0-10_2.13",
    "spark.jars": f"{_MAVEN}/spark-token-provider-kafka-0-10_2.13/4.0.0/"
    "spark-token-provider-kafka-0-10_2.13-4.0.0.jar",
}
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
        if not os.environ.get(KAFKA_PACKAGES_ENV):
            try:
                _session = get_session("local[2]", app_name="streamjoin-tests", conf=conf)
                return _session
            except Exception as exc:  # connector unresolvable: the JVM did not start
                if "JAVA_GATEWAY_EXITED" not in str(exc) and "gateway" not in str(exc).lower():
                    raise
            conf.update(FALLBACK_KAFKA_CONF)
        else:
            conf["spark.jars.packages"] = default_kafka_packages()
        _session = get_session("local[2]", app_name="streamjoin-tests", conf=conf)
        return _session
