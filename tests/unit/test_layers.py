"""The package's layers, checked from the source: no import cycles (``TYPE_CHECKING`` and
function-level imports count), the runtime never imports the App, declarations and pure
cores never import the runtime."""

from __future__ import annotations

import ast
from pathlib import Path

import streamjoin

PACKAGE = Path(streamjoin.__file__).parent

#: what users declare with, and what it is built on: none of it may import the runtime
DECLARATIONS = (
    "streamjoin.agents",
    "streamjoin.app_commands",
    "streamjoin.config",
    "streamjoin.context",
    "streamjoin.errors",
    "streamjoin.events",
    "streamjoin.joins.api",
    "streamjoin.joins.foreign_key_api",
    "streamjoin.punctuation",
    "streamjoin.set_tables",
    "streamjoin.stream",
    "streamjoin.tables",
    "streamjoin.ttl_tables",
    "streamjoin.timers",
    "streamjoin.topics",
    "streamjoin.topology",
    "streamjoin.web_views",
    "streamjoin.windowed",
    "streamjoin.windowed_aggregation",
    "streamjoin.window_views",
)
#: pure cores: no runtime, no declarations, no asyncio, no Kafka client
PURE = (
    "streamjoin.aggregations",
    "streamjoin.assignor",
    "streamjoin.codec_errors",
    "streamjoin.codecs",
    "streamjoin.faust_records",
    "streamjoin.record_codecs",
    "streamjoin.table_inference",
    "streamjoin.schema_registry.wire",
    "streamjoin.joins.core",
    "streamjoin.joins.foreign_key",
    "streamjoin.joins.idle",
    "streamjoin.joins.state",
    "streamjoin.log_summary",
    "streamjoin.native",
    "streamjoin.partitioner",
    "streamjoin.query.retries",
    "streamjoin.query.routing",
    "streamjoin.state.keys",
    "streamjoin.state.restore",
    "streamjoin.state.table_partition",
    "streamjoin.state.window_partition",
    "streamjoin.state.windows",
    "streamjoin.state.sessions",
    "streamjoin.state.aggregate_windows",
    "streamjoin.state.sliding",
    "streamjoin.state.sets",
    "streamjoin.state.ttl",
    "streamjoin.state.global_rows",
    "streamjoin.timers",
    "streamjoin.runtime.tasks.alignment",
    "streamjoin.runtime.metrics",
    "streamjoin.runtime.tasks.offset_ledger",
    "streamjoin.runtime.ops.status_page",
    "streamjoin.runtime.ops.charts",
    "streamjoin.runtime.ops.group_view",
    "streamjoin.runtime.ops.history",
)


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports, anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {
        name: {dep for dep in _imports(name, path) if dep in modules and dep != name}
        for name, path in modules.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph[node]):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_runtime_never_imports_the_app() -> None:
    offenders = {
        name: deps & {"streamjoin.app"}
        for name, deps in _graph().items()
        if name.startswith("streamjoin.runtime") and "streamjoin.app" in deps
    }
    assert offenders == {}


def test_declarations_never_import_the_runtime_or_the_app() -> None:
    offenders = {
        name: sorted(d for d in deps if _under(d, ("streamjoin.runtime", "streamjoin.app")))
        for name, deps in _graph().items()
        if _under(name, DECLARATIONS)
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_pure_cores_import_only_pure_modules() -> None:
    allowed_streamjoin = (*PURE, "streamjoin.errors", "streamjoin.events", "streamjoin.state")
    graph = _graph()
    offenders = {}
    for name, path in _modules().items():
        if not _under(name, PURE):
            continue
        bad = sorted(d for d in graph[name] if not _under(d, allowed_streamjoin))
        third_party = sorted(
            d
            for d in _imports(name, path)
            if d.split(".")[0] in ("asyncio", "aiokafka", "mode", "pyspark", "rocksdict")
        )
        if bad or third_party:
            offenders[name] = bad + third_party
    assert offenders == {}


#: the runtime's folders, and the parts of the runtime each may not import (see each
#: folder's docstring): fetching and producing know nothing of tasks or the group; tasks
#: know nothing of the group or of Kafka; table state knows nothing of tasks or the group;
#: the group knows nothing of tasks; only the worker (and operations, which report on
#: everything) know the group member; nothing imports the worker but the test driver
RUNTIME_FOLDERS: dict[str, tuple[str, ...]] = {
    "streamjoin.runtime.transport": (
        "streamjoin.runtime.tasks",
        "streamjoin.runtime.group",
        "streamjoin.runtime.member",
        "streamjoin.runtime.worker",
    ),
    "streamjoin.runtime.tasks": (
        "streamjoin.runtime.group",
        "streamjoin.runtime.transport.consumer",
        "streamjoin.runtime.transport.fetched_records",
        "streamjoin.runtime.transport.liveness",
        "streamjoin.runtime.transport.producer",
        "streamjoin.runtime.transport.quick_append",
        "streamjoin.runtime.transport.record_limits",
        "streamjoin.runtime.transport.record_scan",
        "streamjoin.runtime.transport.topic_admin",
        "streamjoin.runtime.member",
        "streamjoin.runtime.worker",
    ),
    "streamjoin.runtime.table_state": (
        "streamjoin.runtime.tasks",
        "streamjoin.runtime.group",
        "streamjoin.runtime.member",
        "streamjoin.runtime.worker",
    ),
    "streamjoin.runtime.group": (
        "streamjoin.runtime.tasks",
        "streamjoin.runtime.member",
        "streamjoin.runtime.worker",
    ),
}
#: the runtime services the Worker builds and wires: constructed nowhere else (the
#: in-memory test driver, under ``testing/``, builds its own over in-memory transports)
WORKER_BUILT = frozenset(
    {
        "AgentRuntime",
        "Fetcher",
        "GroupMember",
        "GroupMembership",
        "KafkaSender",
        "PunctuationService",
        "QueryService",
        "ScheduledWork",
        "StateService",
        "TableFlusher",
        "TableStores",
        "TaskManager",
        "TaskProcessing",
        "TimestampAligner",
        "TransactionalSender",
        "WorkerMonitor",
        "WorkerTransaction",
    }
)


def _constructed(path: Path) -> set[str]:
    """Names of ``WORKER_BUILT`` classes called (constructed) in ``path``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name in WORKER_BUILT:
                found.add(name)
    return found


def test_runtime_folders_import_only_what_their_docstrings_allow() -> None:
    offenders = {}
    for name, deps in _graph().items():
        for folder, forbidden in RUNTIME_FOLDERS.items():
            if _under(name, (folder,)):
                bad = sorted(d for d in deps if _under(d, forbidden))
                if bad:
                    offenders[name] = bad
    assert offenders == {}


def test_only_the_worker_constructs_the_runtime_services() -> None:
    offenders = {
        name: sorted(found)
        for name, path in _modules().items()
        if name != "streamjoin.runtime.worker"
        and not _under(name, ("streamjoin.testing",))
        and (found := _constructed(path))
    }
    assert offenders == {}


def test_the_construction_check_sees_a_construction(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from x import TaskProcessing\np = TaskProcessing(1, 2)\nq = mod.Fetcher()\n")
    assert _constructed(source) == {"TaskProcessing", "Fetcher"}


#: the Spark twin runs the workers' pure cores in batch: of the runtime it uses only the
#: topic admin (to create the topics it writes), never tasks, the group or the worker
SPARK_USES_OF_THE_RUNTIME = ("streamjoin.runtime.transport.topic_admin",)


def test_the_spark_twin_uses_only_the_topic_admin_of_the_runtime() -> None:
    offenders = {
        name: sorted(
            d
            for d in deps
            if _under(d, ("streamjoin.runtime",)) and not _under(d, SPARK_USES_OF_THE_RUNTIME)
        )
        for name, deps in _graph().items()
        if _under(name, ("streamjoin.spark",))
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_nothing_outside_testing_imports_testing() -> None:
    offenders = {
        name: sorted(d for d in deps if _under(d, ("streamjoin.testing",)))
        for name, deps in _graph().items()
        if not _under(name, ("streamjoin.testing",))
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_only_the_worker_imports_operations() -> None:
    offenders = {
        name: sorted(d for d in deps if _under(d, ("streamjoin.runtime.ops",)))
        for name, deps in _graph().items()
        if _under(name, ("streamjoin.runtime",))
        and not _under(name, ("streamjoin.runtime.ops", "streamjoin.runtime.worker"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}
