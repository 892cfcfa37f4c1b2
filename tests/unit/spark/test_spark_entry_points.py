"""The documented entry points of ``streamjoin.spark`` resolve to what the docs say they are.

A lazy package attribute is shadowed once a submodule of the same name is imported; this
imports every submodule first (in a fresh interpreter) and then checks each public name.
"""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import importlib, inspect, pkgutil, types
import streamjoin.spark as spark
for info in pkgutil.iter_modules(spark.__path__):
    importlib.import_module(f"streamjoin.spark.{info.name}")
from streamjoin.spark import backfill, bootstrap
assert callable(backfill) and not isinstance(backfill, types.ModuleType), backfill
assert callable(bootstrap) and not isinstance(bootstrap, types.ModuleType), bootstrap
for name in spark.__all__:
    value = getattr(spark, name)
    assert not isinstance(value, types.ModuleType), f"streamjoin.spark.{name} is a module"
print("ok")
"""


def test_public_names_are_not_shadowed_by_submodules() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_public_names_resolve_in_this_interpreter() -> None:
    import streamjoin.spark as spark

    for name in spark.__all__:
        assert getattr(spark, name) is not None
