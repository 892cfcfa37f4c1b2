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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["STREAMJOIN_PURE_PYTHON"] = "1"  # (this process reads the sources, not a build)

from streamjoin.compiled import (  # noqa: E402
    GROUP,
    LIBRARY,
    MANIFEST,
    MODULES,
    build_state,
    extension_files,
    source_hashes,
    source_path,
)

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


def clean() -> None:
    """Remove every extension module in the package (this build's or an older one's)."""
    for path in extension_files().values():
        path.unlink()
    MANIFEST.unlink(missing_ok=True)


def complete() -> bool:
    """Exactly the listed modules and the group's library are built."""
    return set(extension_files()) == {*MODULES, LIBRARY}


def current() -> bool:
    """The build is the one streamjoin would use, with nothing left over from another."""
    used, _ = build_state(set(extension_files()), pure_asked=False)
    return used and complete()


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
    if not complete():
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
    if not args.force and current():
        return 0
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        _log("no C compiler found: the per-event modules run as Python")
        return 0
    _log(f"compiling {len(MODULES)} per-event modules with mypyc")
    build()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
