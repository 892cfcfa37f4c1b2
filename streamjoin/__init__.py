"""streamjoin: correct, fast, stateful joins over Kafka for asyncio Python.

``streamjoin.App`` and the other names users import (window kinds, aggregators,
``PunctuationContext``) are imported lazily so that the pure modules (assignor,
codecs, partitioner) can be used without loading the Kafka runtime.
``streamjoin.errors`` (every error, under :class:`StreamjoinError`) imports
nothing and is loaded right away.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# (first: it decides whether the compiled modules or their sources are imported)
from streamjoin import compiled as _compiled  # noqa: F401
from streamjoin import errors
from streamjoin.errors import StreamjoinError

__version__ = "0.3.0"

if TYPE_CHECKING:
    from streamjoin.aggregations import Collect, Count, Latest, Max, Mean, Min, Reduce, Sum
    from streamjoin.app import App
    from streamjoin.channels import Keyed
    from streamjoin.events import Event
    from streamjoin.punctuation import PunctuationContext
    from streamjoin.runtime.tasks.agent_runtime import Stream
    from streamjoin.state.windows import (
        HoppingWindows,
        SessionWindows,
        SlidingWindows,
        TumblingWindows,
    )
    from streamjoin.stream import EventBatch

#: what users import from ``streamjoin``, and the module each is loaded from on first use
_LAZY = {
    "App": "streamjoin.app",
    "Event": "streamjoin.events",
    "EventBatch": "streamjoin.stream",
    "FaustRecord": "streamjoin.faust_records",
    "Keyed": "streamjoin.channels",
    "Stream": "streamjoin.runtime.tasks.agent_runtime",
    "PunctuationContext": "streamjoin.punctuation",
    **dict.fromkeys(
        ("TumblingWindows", "HoppingWindows", "SlidingWindows", "SessionWindows"),
        "streamjoin.state.windows",
    ),
    **dict.fromkeys(
        ("Collect", "Count", "Latest", "Max", "Mean", "Min", "Reduce", "Sum"),
        "streamjoin.aggregations",
    ),
}

__all__ = [
    "App",
    "Collect",
    "Count",
    "Event",
    "EventBatch",
    "FaustRecord",
    "HoppingWindows",
    "Keyed",
    "Latest",
    "Max",
    "Mean",
    "Min",
    "PunctuationContext",
    "Reduce",
    "SessionWindows",
    "SlidingWindows",
    "Stream",
    "StreamjoinError",
    "Sum",
    "TumblingWindows",
    "__version__",
    "errors",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'streamjoin' has no attribute {name!r}")
    return getattr(import_module(module), name)
