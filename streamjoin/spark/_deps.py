"""The one place that imports pyspark, so ``import streamjoin`` never needs it."""

from __future__ import annotations

from types import ModuleType

INSTALL_HINT = "pip install streamjoin[spark]"


class SparkNotInstalled(ImportError):
    """PySpark is missing: the Spark jobs are an optional extra."""


def require_pyspark() -> ModuleType:
    """Import pyspark or fail with the install command, not a bare ModuleNotFoundError."""
    try:
        import pyspark
    except ModuleNotFoundError as exc:
        raise SparkNotInstalled(
            f"streamjoin.spark needs PySpark, which is not installed: run `{INSTALL_HINT}`"
        ) from exc
    return pyspark
