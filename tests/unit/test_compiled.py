"""The mypyc build of the per-event modules (streamjoin.compiled): when it is used, and
that the same sources run as Python give the same results."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamjoin import compiled
from streamjoin.compiled import MODULES, compiled_modules, decide, source_hashes

ROOT = Path(__file__).resolve().parents[2]
CURRENT = {"streamjoin.tables": "a" * 40, "streamjoin.windowed": "b" * 40}


def test_a_current_complete_build_is_used() -> None:
    used, why = decide(
        built=True, complete=True, pure_asked=False, recorded=dict(CURRENT), current=CURRENT
    )
    assert used and why == "compiled (mypyc, 2 modules)"


def test_an_edited_source_runs_every_listed_module_as_python() -> None:
    edited = {**CURRENT, "streamjoin.windowed": "c" * 40}
    used, why = decide(
        built=True, complete=True, pure_asked=False, recorded=dict(CURRENT), current=edited
    )
    assert not used
    assert "sources changed since they were compiled: streamjoin.windowed" in why


@pytest.mark.parametrize(
    ("built", "complete", "pure_asked", "recorded", "reason"),
    [
        (False, False, False, None, "not compiled"),
        (True, True, True, dict(CURRENT), "STREAMJOIN_PURE_PYTHON=1"),
        (True, True, False, None, "no build manifest"),
        (True, True, False, {"streamjoin.tables": "a" * 40}, "another set"),
        (True, False, False, dict(CURRENT), "another set"),
    ],
)
def test_anything_but_a_current_complete_build_runs_as_python(
    built: bool, complete: bool, pure_asked: bool, recorded: object, reason: str
) -> None:
    used, why = decide(
        built=built, complete=complete, pure_asked=pure_asked, recorded=recorded, current=CURRENT
    )
    assert not used and why.startswith("pure Python") and reason in why


def test_every_listed_module_has_a_source_and_is_imported_from_the_right_place() -> None:
    assert set(source_hashes()) == set(MODULES)
    for name in MODULES:
        module = sys.modules.get(name) or __import__(name, fromlist=["_"])
        suffix = Path(module.__file__ or "").suffix
        assert suffix == (".so" if compiled_modules() else ".py"), (name, compiled.status())


def _run_as_python(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """This interpreter with ``args``, in the checkout, under STREAMJOIN_PURE_PYTHON=1."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, "STREAMJOIN_PURE_PYTHON": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_pure_python_asked_imports_the_sources() -> None:
    done = _run_as_python(
        "-c",
        "import streamjoin.windowed as w, streamjoin.compiled as c; "
        "print(w.__file__); print(c.status())",
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    path, why = done.stdout.strip().splitlines()
    assert path.endswith("streamjoin/windowed.py")
    assert why.startswith("pure Python")


@pytest.mark.skipif(not compiled_modules(), reason="pure Python here: every test ran so")
def test_the_tests_left_to_pure_python_pass_as_python() -> None:
    """Where the modules run compiled, the tests that patch or subclass their classes
    (marked ``pure_python``) and the state tests run again, as Python: the twin keeps
    its tests."""
    done = _run_as_python(
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "tests/unit/state",
        "tests/unit/joins/test_join_buffer_in_memory.py",
        timeout=600,
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in summary and "skipped" not in summary, summary
