"""Compile streamjoin's per-event modules with mypyc, next to their sources.

    .venv/bin/python scripts/compile_modules.py [--force] [--clean]

Run by ``scripts/bootstrap.sh`` when mypyc is installed (the ``lint`` extra brings it);
quick when the build is current. The modules are those of ``streamjoin.compiled.MODULES``;
their hashes go into ``streamjoin/compiled-manifest.json``, which ``streamjoin.compiled``
checks at import, so an edited source runs as pure Python until it is compiled again.
``--clean`` removes the build (the sources then run as they are).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["STREAMJOIN_PURE_PYTHON"] = "1"  # (this process reads the sources, not a build)

from streamjoin.compiled import GROUP, MANIFEST, MODULES, source_hashes, source_path  # noqa: E402

_SETUP = """
from setuptools import setup
from mypyc.build import mypycify

setup(
    name="streamjoin-compiled",
    ext_modules=mypycify(
        ["--config-file", "mypy.ini", *{paths!r}], opt_level="3", group_name={group!r}
    ),
    script_args=["build_ext", "--inplace"],
)
"""


#: the project's mypy settings that compiling needs (pyproject.toml's also list the
#: package to check, which would compile all of it)
_MYPY_INI = """
[mypy]
python_version = 3.11
[mypy-aiokafka.*,mode.*,rocksdict.*,pyspark.*,opentelemetry.*,croniter.*,jsonschema.*]
ignore_missing_imports = True
"""


def _log(message: str) -> None:
    print(f"[compile] {message}", file=sys.stderr, flush=True)


def built_files() -> list[Path]:
    """The extension modules in the package: a build's (or an older build's)."""
    package = ROOT / "streamjoin"
    return [
        path for path in package.rglob("*") if path.name.endswith(tuple(EXTENSION_SUFFIXES))
    ]


def clean() -> None:
    for path in built_files():
        path.unlink()
    MANIFEST.unlink(missing_ok=True)


def current(hashes: dict[str, str]) -> bool:
    try:
        recorded = json.loads(MANIFEST.read_text())["modules"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return bool(recorded == hashes and len(built_files()) == len(MODULES) + 1)


def build() -> None:
    hashes = source_hashes()
    clean()
    started = time.monotonic()
    paths = [str(source_path(name).relative_to(ROOT)) for name in MODULES]
    with tempfile.TemporaryDirectory(prefix="streamjoin-mypyc-") as tmp:
        # (built in a directory of its own: setuptools would read the project's
        # pyproject.toml, and the build's objects stay out of the checkout)
        work = Path(tmp)
        (work / "streamjoin").symlink_to(ROOT / "streamjoin", target_is_directory=True)
        (work / "mypy.ini").write_text(_MYPY_INI)
        (work / "setup.py").write_text(_SETUP.format(paths=paths, group=GROUP))
        done = subprocess.run(
            [sys.executable, "setup.py"],
            cwd=work,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            clean()
            sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
            raise SystemExit(f"mypyc failed (exit {done.returncode}): the sources run as Python")
    if len(built_files()) != len(MODULES) + 1:
        clean()
        raise SystemExit("mypyc built fewer modules than listed: the sources run as Python")
    MANIFEST.write_text(json.dumps({"modules": hashes}, indent=1, sort_keys=True) + "\n")
    _log(f"compiled {len(MODULES)} modules in {time.monotonic() - started:.0f}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="compile even if current")
    parser.add_argument("--clean", action="store_true", help="remove the build")
    args = parser.parse_args(argv)
    if args.clean:
        clean()
        _log("removed the compiled modules")
        return 0
    if not args.force and current(source_hashes()):
        return 0
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        _log("no C compiler found: the per-event modules run as Python")
        return 0
    _log(f"compiling {len(MODULES)} per-event modules with mypyc")
    build()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
