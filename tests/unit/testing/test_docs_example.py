"""docs/app.md's test-driver example, run as a user would: the app at the top of the page,
the test file and the pytest configuration the page gives, in a fresh project, with
``pytest`` (and streamjoin's pytest plugin, as installed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
APP_DOC = ROOT / "docs" / "app.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", APP_DOC.read_text(), re.S)


def test_the_documented_driver_test_passes_with_the_documented_config(tmp_path: Path) -> None:
    python = _blocks("python")
    (tmp_path / "myproj").mkdir()
    (tmp_path / "tests").mkdir()
    assert python[0].startswith("# myproj/app.py")
    (tmp_path / "myproj" / "app.py").write_text(python[0])
    (test,) = [block for block in python if "TestDriver(app)" in block]
    (tmp_path / "tests" / "test_route.py").write_text(test)
    (config,) = _blocks("toml")
    assert "asyncio_mode" in config
    (tmp_path / "pyproject.toml").write_text(config)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's streamjoin
    env.pop("PYTEST_ADDOPTS", None)
    # the `pytest` command, not `python -m pytest` (which would make myproj importable anyway)
    script = Path(sys.executable).with_name("pytest")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "pytest"]
    result = subprocess.run(
        [*command, "-q", "-p", "no:cacheprovider", "tests"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
