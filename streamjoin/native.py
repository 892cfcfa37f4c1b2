"""The compiled hot paths (``native/``, the ``streamjoin_native`` Rust extension), when
they are installed.

``scripts/bootstrap.sh`` builds them wherever cargo is found. Each compiled function has a
pure-Python twin next to where it is used (:mod:`streamjoin.partitioner`,
:mod:`streamjoin.codecs`) that gives the same results; property tests compare the two.
``STREAMJOIN_PURE_PYTHON=1`` in the environment uses the twins even when the extension is
installed. An extension built from older sources lacks newer functions: each caller asks
for the function it needs and falls back to its twin without it.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["native_function"]


def native_function(name: str) -> Any:
    """The compiled function ``name``, or None (not installed, too old to have it, or
    pure Python asked for)."""
    if os.environ.get("STREAMJOIN_PURE_PYTHON") == "1":
        return None
    try:
        import streamjoin_native  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    return getattr(streamjoin_native, name, None)
