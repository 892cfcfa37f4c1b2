"""Spark's Kafka connector, resolved once from Maven Central with Maven into our cache.

The connector must match the running Spark. When the release matching the
installed PySpark is not published, the newest published connector is used
instead (Spark 4.x connectors are compatible within 4.x for what we use), with
the last published token-provider jar: Spark stopped publishing
``spark-token-provider-kafka`` after 4.0.0, and later connectors still depend on
it. Jars PySpark already ships (Scala, Hadoop client, ...) are left out so the
classpath never holds two versions of one library.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from streamjoin.errors import ProvisioningError
from streamjoin.maven import copy_dependencies, default_cache_dir, file_lock, find_maven

SCALA_BINARY = "2.13"
#: newest connector known to be published, used when the matching one is not
FALLBACK_CONNECTOR = "4.2.0"
#: last published token provider (a dependency of every 4.x connector)
TOKEN_PROVIDER = "4.0.0"
_COMPLETE = ".complete"


def _pom(connector: str, token_provider: str | None) -> str:
    group = "org.apache.spark"
    exclusion = (
        f"<exclusions><exclusion><groupId>{group}</groupId>"
        f"<artifactId>spark-token-provider-kafka-0-10_{SCALA_BINARY}</artifactId>"
        "</exclusion></exclusions>"
        if token_provider
        else ""
    )
    extra = (
        f"<dependency><groupId>{group}</groupId>"
        f"<artifactId>spark-token-provider-kafka-0-10_{SCALA_BINARY}</artifactId>"
        f"<version>{token_provider}</version></dependency>"
        if token_provider
        else ""
    )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>io.streamjoin.dev</groupId><artifactId>spark-kafka</artifactId>"
        "<version>1</version><packaging>pom</packaging><dependencies>"
        f"<dependency><groupId>{group}</groupId>"
        f"<artifactId>spark-sql-kafka-0-10_{SCALA_BINARY}</artifactId>"
        f"<version>{connector}</version>{exclusion}</dependency>{extra}"
        "</dependencies></project>"
    )


def _artifact(jar: Path) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients``."""
    return re.sub(r"-\d[\w.\-]*$", "", jar.stem)


def kafka_connector_jars(spark_version: str, pyspark_jars: Path | None = None) -> list[Path]:
    """Local jar paths of the Kafka connector for ``spark_version`` (resolved once)."""
    root = default_cache_dir() / "spark-kafka" / spark_version
    libs = root / "libs"
    if (libs / _COMPLETE).exists():
        return sorted(libs.glob("*.jar"))
    with file_lock(root / ".lock"):
        if (libs / _COMPLETE).exists():
            return sorted(libs.glob("*.jar"))
        staging = root / "libs.partial"
        shutil.rmtree(staging, ignore_errors=True)
        result = copy_dependencies(find_maven(), _pom(spark_version, None), staging)
        if result.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            result = copy_dependencies(
                find_maven(), _pom(FALLBACK_CONNECTOR, TOKEN_PROVIDER), staging
            )
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-10:])
            raise ProvisioningError(
                f"could not resolve spark-sql-kafka-0-10_{SCALA_BINARY} for Spark {spark_version} "
                f"(nor {FALLBACK_CONNECTOR}) from Maven Central; set "
                f"STREAMJOIN_SPARK_KAFKA_PACKAGES to coordinates that exist. Maven said:\n{tail}"
            )
        shipped = {_artifact(j) for j in pyspark_jars.glob("*.jar")} if pyspark_jars else set()
        for jar in staging.glob("*.jar"):
            if _artifact(jar) in shipped:
                jar.unlink()
        (staging / _COMPLETE).write_text(spark_version + "\n")
        shutil.rmtree(libs, ignore_errors=True)
        staging.rename(libs)
        return sorted(libs.glob("*.jar"))
