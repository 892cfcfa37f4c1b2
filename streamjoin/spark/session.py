"""Building the SparkSession: local by default, Kafka connector resolved from Maven Central.

By default the connector's jars are resolved with Maven into the streamjoin cache
(``streamjoin.spark.connector``: the release matching the installed PySpark, or
the newest published one). To use other coordinates through Spark's own
resolver, set ``STREAMJOIN_SPARK_KAFKA_PACKAGES`` (or pass
``kafka_packages=``/``--kafka-packages``);
``spark.*`` settings can be added with ``STREAMJOIN_SPARK_CONF`` (``k=v;k=v``)
or ``conf=``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamjoin.spark._deps import require_pyspark
from streamjoin.spark.progress import Counters, Progress, ProgressReporter

__all__ = [
    "KAFKA_PACKAGES_ENV",
    "SPARK_CONF_ENV",
    "SparkRun",
    "default_kafka_packages",
    "get_session",
    "ivy_cache_dir",
]

KAFKA_PACKAGES_ENV = "STREAMJOIN_SPARK_KAFKA_PACKAGES"
SPARK_CONF_ENV = "STREAMJOIN_SPARK_CONF"
SCALA_BINARY = "2.13"


def default_kafka_packages() -> str:
    """``spark-sql-kafka-0-10`` for the installed PySpark, unless the environment overrides it."""
    override = os.environ.get(KAFKA_PACKAGES_ENV)
    if override:
        return override
    pyspark = require_pyspark()
    return f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_BINARY}:{pyspark.__version__}"


def default_kafka_jars() -> list[Path]:
    """The connector for the installed PySpark, resolved with Maven into our cache."""
    from streamjoin.spark.connector import kafka_connector_jars

    pyspark = require_pyspark()
    jars = Path(pyspark.__file__ or ".").parent / "jars"
    return kafka_connector_jars(pyspark.__version__, jars if jars.is_dir() else None)


def ivy_cache_dir() -> Path:
    """Per-user Ivy cache, so the connector is downloaded once, not per job."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "streamjoin" / "ivy"


def _env_conf() -> dict[str, str]:
    conf: dict[str, str] = {}
    for item in os.environ.get(SPARK_CONF_ENV, "").split(";"):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            conf[key.strip()] = value.strip()
    return conf


def _ship_driver_path_to_local_workers(master: str) -> None:
    """Local Python workers are started by the JVM, which inherits our environment: give them
    the driver's import path so user modules (``-A module:app``) import there too."""
    if not master.startswith("local"):
        return
    entries = [p for p in sys.path if p and os.path.isdir(p)]
    entries.insert(0, os.getcwd())
    current = os.environ.get("PYTHONPATH", "")
    merged = list(dict.fromkeys([*entries, *filter(None, current.split(os.pathsep))]))
    os.environ["PYTHONPATH"] = os.pathsep.join(merged)


def get_session(
    master: str = "local[*]",
    *,
    app_name: str = "streamjoin",
    kafka: bool = True,
    kafka_packages: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> Any:
    """A SparkSession (the active one if there is one: Spark allows one per process).

    ``kafka`` adds the Kafka connector to ``spark.jars.packages``; it only takes
    effect when this call starts the JVM.
    """
    require_pyspark()
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    _ship_driver_path_to_local_workers(master)
    builder = SparkSession.builder.master(master).appName(app_name)
    settings: dict[str, str] = {
        "spark.sql.shuffle.partitions": "8" if master.startswith("local") else "200",
        "spark.jars.ivy": str(ivy_cache_dir()),
        "spark.python.worker.reuse": "true",
    }
    if kafka:
        packages = kafka_packages or os.environ.get(KAFKA_PACKAGES_ENV)
        if packages:
            settings["spark.jars.packages"] = packages
        else:
            settings["spark.jars"] = ",".join(str(j) for j in default_kafka_jars())
    settings.update(_env_conf())
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


@dataclass(frozen=True)
class SparkRun:
    """How a job gets its Spark session and reports progress: the options every backfill
    and bootstrap takes (``spark``: an existing session, else one built for ``master``;
    ``progress``: called with a :class:`Progress` every ``progress_interval`` s)."""

    master: str = "local[*]"
    spark: Any = None
    kafka_packages: str | None = None
    spark_conf: Mapping[str, str] | None = None
    progress: Callable[[Progress], None] | None = None
    progress_interval: float = 2.0

    def session(self, app_name: str, *, kafka: bool) -> Any:
        """The given session, else one named ``app_name`` (``kafka``: with the connector)."""
        if self.spark is not None:
            return self.spark
        return get_session(
            self.master,
            app_name=app_name,
            kafka=kafka,
            kafka_packages=self.kafka_packages,
            conf=self.spark_conf,
        )

    def reporter(self, job: str, counters: Counters, tasks: int) -> ProgressReporter:
        return ProgressReporter(job, counters, tasks, self.progress, self.progress_interval)
