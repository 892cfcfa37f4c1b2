"""The one place that imports pyspark, so ``import streamjoin`` never needs it."""

from __future__ import annotations

from types import ModuleType

from streamjoin.errors import SparkNotInstalled

INSTALL_HINT = "pip install streamjoin[spark]"


def require_pyspark() -> ModuleType:
    """Import pyspark or fail with the install command, not a bare ModuleNotFoundError."""
    try:
        import pyspark
    except ModuleNotFoundError as exc:
        raise SparkNotInstalled(
            f"streamjoin.spark needs PySpark, which is not installed: run `{INSTALL_HINT}`"
        ) from exc
    return pyspark
