"""Tests marked ``pure_python`` patch or subclass a class that mypyc compiles
(``streamjoin.compiled.MODULES``): compiled classes take neither. Where the modules run
compiled, those tests are left to the pure-Python pass that ``tests/unit/test_compiled.py``
runs in a subprocess; where they run as Python, they run here like any other."""

from __future__ import annotations

import pytest

from streamjoin.compiled import compiled_modules


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not compiled_modules():
        return
    for item in items:
        if item.get_closest_marker("pure_python") is not None:
            item.add_marker(
                pytest.mark.skip(
                    reason="patches or subclasses a compiled class: run by "
                    "tests/unit/test_compiled.py's pure-Python pass"
                )
            )
