"""Find the user's App from a ``module:attribute`` string (as in ``-A myproj.app:app``)."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import TYPE_CHECKING

from streamjoin.errors import AppNotFound, StartupError

if TYPE_CHECKING:
    from streamjoin.app import App


def load_app(spec: str) -> App:
    """Import ``module`` and return its ``attribute`` (default ``app``); the current directory
    is importable, like ``python -m``."""
    from streamjoin.app import App

    module_name, _, attribute = spec.partition(":")
    attribute = attribute or "app"
    if not module_name:
        raise AppNotFound(f"-A {spec!r}: expected 'package.module:app'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise AppNotFound(
                f"-A {spec!r}: module {module_name!r} was not found (is it on PYTHONPATH?)"
            ) from exc
        raise StartupError(f"-A {spec!r}: {_where(exc)}") from exc
    except SyntaxError as exc:
        raise StartupError(
            f"-A {spec!r}: {exc.filename}:{exc.lineno}: SyntaxError: {exc.msg}"
        ) from exc
    except Exception as exc:
        raise StartupError(f"-A {spec!r}: {_where(exc)}") from exc
    obj: object = module
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise AppNotFound(f"-A {spec!r}: {module_name} has no attribute {attribute!r}")
        obj = getattr(obj, part)
    if not isinstance(obj, App):
        raise AppNotFound(
            f"-A {spec!r}: {module_name}.{attribute} is a {type(obj).__name__}, "
            "not a streamjoin.App"
        )
    return obj


def _where(exc: BaseException) -> str:
    """``file:line: Type: message`` of the innermost frame outside importlib's machinery:
    the line of the user's module that raised, without the import system's frames."""
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith("<frozen") and "importlib" not in f.filename
    ]
    place = f"{frames[-1].filename}:{frames[-1].lineno}: " if frames else ""
    return f"{place}{type(exc).__name__}: {exc}"
