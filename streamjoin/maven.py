"""Jars from Maven Central, resolved once into a per-user cache with Apache Maven.

Both the local development broker (:mod:`streamjoin.local_kafka`) and Spark's Kafka
connector (:mod:`streamjoin.spark.connector`) get their jars this way: a throwaway POM
whose runtime dependencies are exactly the jars wanted, copied by ``mvn`` into a staging
directory, under a file lock so two processes (the demo and the tests) never resolve
the same jars at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from streamjoin.errors import KafkaProvisioningError


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Per-user cache root: ``$STREAMJOIN_CACHE_DIR``, else ``$XDG_CACHE_HOME/streamjoin``,
    else ``~/.cache/streamjoin``."""
    env = os.environ if env is None else env
    if env.get("STREAMJOIN_CACHE_DIR"):
        return Path(env["STREAMJOIN_CACHE_DIR"]).expanduser()
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "streamjoin"
    return Path.home() / ".cache" / "streamjoin"


def find_maven(env: Mapping[str, str] | None = None) -> str:
    """Path of ``mvn``, used once to resolve jars into the cache."""
    env = os.environ if env is None else env
    mvn = shutil.which("mvn", path=env.get("PATH"))
    if mvn is None:
        raise KafkaProvisioningError(
            "Apache Maven (`mvn`) was not found; it resolves jars (the local Kafka broker's, "
            "Spark's Kafka connector) from Maven Central once. Install it (Debian/Ubuntu: "
            "`apt-get install maven`)."
        )
    return mvn


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Serialize resolution between processes (e.g. the demo and the tests at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def copy_dependencies(mvn: str, pom: str, target: Path) -> subprocess.CompletedProcess[str]:
    """Copy the runtime dependencies of ``pom`` (a POM's text) into ``target`` with ``mvn``;
    the caller reads the return code and Maven's output."""
    with tempfile.TemporaryDirectory(prefix="streamjoin-pom-") as work:
        path = Path(work) / "pom.xml"
        path.write_text(pom)
        return subprocess.run(
            [
                mvn,
                "-B",
                "-q",
                "-f",
                str(path),
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={target}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
