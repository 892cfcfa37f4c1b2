#!/usr/bin/env bash
# Prepares this checkout on a fresh machine, idempotently and quickly when already done:
#   - Java 17+ and Maven (Debian packages) for the project-provisioned Kafka broker, and with
#     the test extra Chromium (the status page's browser test),
#   - a virtual environment in .venv with streamjoin installed (editable) plus the extras named
#     in $1 (comma-separated, e.g. "test,lint").
# The broker's jars themselves are resolved from Maven Central on first use and cached
# (~/.cache/streamjoin), by streamjoin.testing.kafka.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
extras="${1:-}"
cd "$root"

missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
# With the test extra: headless Chromium, which renders the status page in its browser test.
if [[ ",$extras," == *",test,"* ]] && ! command -v chromium >/dev/null 2>&1; then
  missing+=(chromium)
fi
if ((${#missing[@]})); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[bootstrap] installing ${missing[*]} (Debian packages)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "[bootstrap] please install: ${missing[*]} (Java 17+ and Maven run the local Kafka broker; the tests render the status page in Chromium)" >&2
    exit 1
  fi
fi

python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[bootstrap] creating .venv with $($python --version)" >&2
  "$python" -m venv .venv
fi
# Reinstall only when the package metadata or the wanted extras change.
hash="$(sha1sum < pyproject.toml | cut -c1-12)"
stamp=".venv/.streamjoin-$hash-${extras//,/_}"
if [ ! -f "$stamp" ]; then
  echo "[bootstrap] installing streamjoin${extras:+[$extras]} into .venv" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extras:+[$extras]}"
  find .venv -maxdepth 1 -name '.streamjoin-*' ! -name ".streamjoin-$hash-*" ! -name '.streamjoin-native-*' -delete
  touch "$stamp"
fi

# The compiled hot paths (native/: a Rust extension built with maturin from crates.io), where
# cargo is found; without it streamjoin runs their pure-Python twins (same results, slower).
if command -v cargo >/dev/null 2>&1; then
  native_hash="$(cat native/Cargo.toml native/Cargo.lock native/pyproject.toml native/src/*.rs \
    native/*.pyi | sha1sum | cut -c1-12)"
  native_stamp=".venv/.streamjoin-native-$native_hash"
  if [ ! -f "$native_stamp" ]; then
    echo "[bootstrap] building the compiled hot paths (native/, cargo)" >&2
    .venv/bin/python -m pip install -q --disable-pip-version-check ./native
    find .venv -maxdepth 1 -name '.streamjoin-native-*' ! -name ".streamjoin-native-$native_hash" -delete
    touch "$native_stamp"
  fi
else
  echo "[bootstrap] cargo not found: the pure-Python partitioner is used (install Rust to build native/)" >&2
fi

# The per-event modules compiled with mypyc (scripts/compile_modules.py; quick when current),
# where mypyc is installed (the lint extra brings it) and a C compiler is found; otherwise
# they run as the Python they are compiled from (same results, slower).
if .venv/bin/python -c "import mypyc" >/dev/null 2>&1; then
  .venv/bin/python scripts/compile_modules.py
else
  echo "[bootstrap] mypyc not installed: the per-event modules run as Python (install the lint extra to compile them)" >&2
fi
