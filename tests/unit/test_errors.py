"""One error hierarchy: every exception streamjoin defines is a StreamjoinError from
``streamjoin.errors``, imported from there only, one class per failure a caller tells apart,
with the built-in bases callers relied on."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
import re
from collections import defaultdict
from enum import Enum
from pathlib import Path

import pytest

import streamjoin
from streamjoin import errors
from streamjoin.errors import StreamjoinError

PACKAGE_DIR = Path(streamjoin.__file__).parent


def _all_modules() -> list[str]:
    return [
        "streamjoin",
        *(m.name for m in pkgutil.walk_packages([str(PACKAGE_DIR)], "streamjoin.")),
    ]


def _exception_classes() -> dict[str, set[type[BaseException]]]:
    """Exception classes reachable as module attributes anywhere in the package, by where."""
    found: dict[str, set[type[BaseException]]] = defaultdict(set)
    for name in _all_modules():
        module = importlib.import_module(name)  # pyspark is only imported when a job runs
        for attr, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__.startswith("streamjoin")
                and not attr.startswith("_")
                and not obj.__name__.startswith("_")
            ):
                found[f"{name}.{attr}"].add(obj)
    return found


FOUND = _exception_classes()
CLASSES = {cls for classes in FOUND.values() for cls in classes}


def test_the_walk_finds_the_errors_of_every_layer() -> None:
    for where in (
        "streamjoin.codec_errors.DecodeError",
        "streamjoin.app.ConfigurationError",
        "streamjoin.state.rocksdb.StoreCorrupted",
        "streamjoin.assignor.protocol.UserdataError",
        "streamjoin.runtime.run.StartupError",
        "streamjoin.spark.bootstrap_job.SparkJobError",
        "streamjoin.local_kafka.BrokerExitedError",
    ):
        assert where in FOUND


@pytest.mark.parametrize("cls", sorted(CLASSES, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_every_exception_is_a_streamjoin_error_defined_in_errors(cls: type[BaseException]) -> None:
    assert issubclass(cls, StreamjoinError)
    assert cls.__module__ == "streamjoin.errors", f"define {cls.__name__} in streamjoin/errors.py"
    assert cls.__name__ in errors.__all__
    assert cls.__doc__ and cls.__doc__.strip(), f"{cls.__name__} needs a docstring"


def test_no_exception_class_is_defined_outside_errors() -> None:
    # catches classes the attribute walk cannot see (e.g. deleted or shadowed names)
    offenders = []
    exception_bases = {c.__name__ for c in CLASSES} | {"Exception", "BaseException"}
    exception_bases |= {n for n in dir(builtins) if n.endswith(("Error", "Exception"))}
    for path in PACKAGE_DIR.rglob("*.py"):
        if path.name == "errors.py" and path.parent == PACKAGE_DIR:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                bases = {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases}
                if bases & exception_bases:
                    offenders.append(f"{path.relative_to(PACKAGE_DIR)}: {node.name}")
    assert offenders == []


def test_errors_all_lists_exactly_its_public_names() -> None:
    public = {
        name
        for name, obj in vars(errors).items()
        if inspect.isclass(obj)
        and obj.__module__ == "streamjoin.errors"
        and not name.startswith("_")
    }
    assert set(errors.__all__) == public
    assert list(errors.__all__) == sorted(errors.__all__)
    for name in errors.__all__:
        obj = getattr(errors, name)
        if issubclass(obj, Enum) or not issubclass(obj, BaseException):
            continue  # ViolationCode, Violation: the payload of InvalidAssignmentError
        assert issubclass(obj, StreamjoinError), name


def test_errors_imports_nothing_from_streamjoin() -> None:
    tree = ast.parse((PACKAGE_DIR / "errors.py").read_text())
    imported = [
        node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
    ] + [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    ]
    assert not [m for m in imported if m.split(".")[0] == "streamjoin"]


#: Every error class and its streamjoin base(s): the tree docs/app.md ("Errors") shows. A new
#: class is a new thing for users to learn: add one only for a failure callers handle apart
#: from its family (else raise the family with a message saying what happened).
TREE: dict[str, tuple[str, ...]] = {
    "StreamjoinError": (),
    "ConfigurationError": ("StreamjoinError",),
    "CopartitioningError": ("ConfigurationError",),
    "StateDirInUse": ("ConfigurationError",),
    "ArgumentTypeError": ("StreamjoinError",),
    "NotFoundError": ("StreamjoinError",),
    "AppNotFound": ("NotFoundError",),
    "UnknownTopicError": ("NotFoundError",),
    "CodecError": ("StreamjoinError",),
    "EncodeError": ("CodecError",),
    "DecodeError": ("CodecError",),
    "StateError": ("StreamjoinError",),
    "StoreError": ("StateError",),
    "StoreCorrupted": ("StoreError",),
    "StoreLocked": ("StoreError",),
    "KeyEncodingError": ("StateError",),
    "IncompatibleWindowState": ("KeyEncodingError",),
    "ChangelogReadError": ("StateError",),
    "ChangelogOffsetOutOfRange": ("ChangelogReadError",),
    "CorruptRecordSet": ("StateError",),
    "ProcessingError": ("StreamjoinError",),
    "LifecycleError": ("ProcessingError",),
    "AgentFailed": ("ProcessingError",),
    "MissingFieldError": ("ProcessingError",),
    "TimerFailed": ("ProcessingError",),
    "TableAccessError": ("ProcessingError",),
    "HistoryExpired": ("TableAccessError",),
    "RecordRejected": ("ProcessingError",),
    "RecordTooLargeError": ("RecordRejected",),
    "GroupMembershipError": ("ProcessingError",),
    "FencedInstanceError": ("GroupMembershipError",),
    "TransactionError": ("ProcessingError",),
    "TransactionFailed": ("ProcessingError",),
    "JoinError": ("StreamjoinError",),
    "CorruptJoinState": ("JoinError",),
    "AssignorError": ("StreamjoinError",),
    "InvalidScenarioError": ("AssignorError",),
    "InvalidAssignmentError": ("AssignorError",),
    "UserdataError": ("AssignorError",),
    "UnsupportedUserdataVersion": ("UserdataError",),
    "ProvisioningError": ("StreamjoinError",),
    "OffsetMoveRefused": ("ProvisioningError",),
    "KafkaProvisioningError": ("ProvisioningError",),
    "BrokerExitedError": ("KafkaProvisioningError",),
    "StartupError": ("StreamjoinError",),
    "AccessRefused": ("StartupError",),
    "SparkJobError": ("StreamjoinError",),
    "SparkNotInstalled": ("SparkJobError",),
    "QueryError": ("StreamjoinError",),
    "QueryKeyError": ("QueryError",),
    "UnknownTableError": ("QueryError", "NotFoundError"),
    "KeyNotFound": ("QueryError", "NotFoundError"),
    "QueryUnauthorized": ("QueryError",),
    "QueryUnavailable": ("QueryError",),
    "QueryFailed": ("QueryError",),
    "InternalError": ("StreamjoinError",),
    "SchemaRegistryError": ("StreamjoinError",),
    "SchemaNotFound": ("SchemaRegistryError", "NotFoundError"),
    "IncompatibleSchema": ("SchemaRegistryError",),
}


def _error_classes() -> dict[str, type[BaseException]]:
    return {
        name: obj
        for name in errors.__all__
        if isinstance(obj := getattr(errors, name), type) and issubclass(obj, BaseException)
    }


def test_the_hierarchy_is_the_documented_tree() -> None:
    tree = {
        name: tuple(b.__name__ for b in cls.__bases__ if b.__module__ == "streamjoin.errors")
        for name, cls in _error_classes().items()
    }
    assert tree == TREE


def test_the_docs_show_every_error() -> None:
    docs = (PACKAGE_DIR.parent / "docs" / "app.md").read_text()
    section = docs.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    missing = [name for name in _error_classes() if not re.search(rf"\b{name}\b", section)]
    assert missing == []


def test_errors_are_imported_from_errors_only() -> None:
    """No module re-exports an error (in ``__all__``, as ``X as X`` or under another name):
    one import path per error, ``streamjoin.errors`` (and ``streamjoin.StreamjoinError``)."""
    names = set(_error_classes())
    offenders = []
    for path in PACKAGE_DIR.rglob("*.py"):
        if path == PACKAGE_DIR / "errors.py":
            continue
        where = path.relative_to(PACKAGE_DIR)
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = node.value
                if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                    assert isinstance(value, ast.List | ast.Tuple)
                    exported = {e.value for e in value.elts if isinstance(e, ast.Constant)}
                    if path != PACKAGE_DIR / "__init__.py":
                        offenders += [f"{where}: __all__ has {n}" for n in exported & names]
                elif isinstance(value, ast.Name) and value.id in names:
                    offenders.append(f"{where}: {ast.unparse(node)}")
        for imp in ast.walk(tree):
            if isinstance(imp, ast.ImportFrom) and (imp.module or "").startswith("streamjoin"):
                offenders += [
                    f"{where}: imports {a.name} as {a.asname}"
                    for a in imp.names
                    if a.name in names and a.asname is not None
                ]
                if imp.module != "streamjoin.errors":
                    offenders += [
                        f"{where}: imports {a.name} from {imp.module}"
                        for a in imp.names
                        if a.name in names
                    ]
    assert offenders == []


def test_the_package_exports_the_root_and_the_module() -> None:
    assert streamjoin.StreamjoinError is StreamjoinError
    assert streamjoin.errors is errors
    assert {"StreamjoinError", "errors"} <= set(streamjoin.__all__)


def test_one_name_per_class() -> None:
    # a module may import an error to raise or catch it, but under its own name only
    by_class: dict[type[BaseException], set[str]] = defaultdict(set)
    for where, classes in FOUND.items():
        for cls in classes:
            by_class[cls].add(where.rsplit(".", 1)[1])
            assert where.rsplit(".", 1)[1] == cls.__name__, f"{where} is another name for {cls}"
    names = [cls.__name__ for cls in by_class]
    assert len(names) == len(set(names))


def test_copartitioning_has_one_name() -> None:
    from streamjoin import spark
    from streamjoin.runtime.transport import topic_admin
    from streamjoin.spark import backfill_job

    assert not hasattr(topic_admin, "TopicPartitionCountMismatch")
    assert not hasattr(backfill_job, "PartitioningMismatch")
    for name in ("PartitioningMismatch", "CopartitioningError"):
        with pytest.raises(AttributeError):
            getattr(spark, name)
    assert issubclass(errors.CopartitioningError, errors.ConfigurationError)


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (errors.ConfigurationError, ValueError),
        (errors.CopartitioningError, ValueError),
        (errors.StateDirInUse, ValueError),
        (errors.ArgumentTypeError, TypeError),
        (errors.NotFoundError, LookupError),
        (errors.AppNotFound, LookupError),
        (errors.UnknownTopicError, KeyError),
        (errors.CodecError, ValueError),
        (errors.DecodeError, ValueError),
        (errors.EncodeError, ValueError),
        (errors.KeyEncodingError, ValueError),
        (errors.ChangelogReadError, RuntimeError),
        (errors.CorruptRecordSet, ValueError),
        (errors.LifecycleError, RuntimeError),
        (errors.AgentFailed, RuntimeError),
        (errors.MissingFieldError, LookupError),
        (errors.TableAccessError, RuntimeError),
        (errors.HistoryExpired, LookupError),
        (errors.RecordTooLargeError, ValueError),
        (errors.JoinError, ValueError),
        (errors.InvalidScenarioError, ValueError),
        (errors.UserdataError, ValueError),
        (errors.ProvisioningError, RuntimeError),
        (errors.KafkaProvisioningError, RuntimeError),
        (errors.OffsetMoveRefused, RuntimeError),
        (errors.SparkNotInstalled, ImportError),
        (errors.KeyNotFound, KeyError),
        (errors.QueryKeyError, ValueError),
        (errors.QueryUnavailable, RuntimeError),
        (errors.InternalError, RuntimeError),
    ],
    ids=lambda x: x.__name__,
)
def test_built_in_bases_callers_rely_on(cls: type[Exception], builtin: type[Exception]) -> None:
    assert issubclass(cls, builtin)


def test_families_that_must_stay_apart() -> None:
    # a wrong-type argument to Codec.loads must not turn into a DecodeError (a bad record)
    # through an `except ValueError`; a missing local store is not a missing key
    assert not issubclass(errors.ArgumentTypeError, ValueError)
    assert not issubclass(errors.NotFoundError, KeyError)
    assert not issubclass(errors.ConfigurationError, TypeError)
    # a locked store is in use: wiping it as if corrupted would destroy a live worker's state
    assert not issubclass(errors.StoreLocked, errors.StoreCorrupted)
    # a bad join definition is a declaration error; JoinError is a bad event or state
    assert not issubclass(errors.JoinError, errors.ConfigurationError)
    assert str(errors.UnknownTopicError("topic 'x' is not declared")) == (
        "topic 'x' is not declared"
    )


_BUILTINS_NOT_TO_RAISE = {"ValueError", "TypeError", "RuntimeError", "LookupError"}


def test_no_bare_built_in_errors_are_raised() -> None:
    # KeyError stays for dict-like misses (table[key]); NotImplementedError for abstract methods
    offenders = []
    for path in PACKAGE_DIR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(exc, ast.Name) and exc.id in _BUILTINS_NOT_TO_RAISE:
                    offenders.append(f"{path.relative_to(PACKAGE_DIR)}:{node.lineno} {exc.id}")
    assert offenders == []


# -- a few of the converted checks, raising their named error -------------------------------


def test_partitioner_arguments() -> None:
    from streamjoin.partitioner import partition_for_key

    with pytest.raises(errors.ConfigurationError):
        partition_for_key(b"k", 0)
    with pytest.raises(errors.ArgumentTypeError):
        partition_for_key(b"k", "3")  # type: ignore[arg-type]


def test_codec_misuse_is_an_argument_type_error_not_a_bad_record() -> None:
    from streamjoin.codecs import JSON, RAW, resolve_codec

    for codec in (RAW, JSON):
        with pytest.raises(errors.ArgumentTypeError) as info:
            codec.loads("text")  # type: ignore[arg-type]
        assert not isinstance(info.value, errors.CodecError)
    with pytest.raises(errors.EncodeError, match="object is not JSON serializable"):
        JSON.dumps(object())
    with pytest.raises(errors.ConfigurationError, match="unknown codec 'nope'"):
        resolve_codec("nope")
    with pytest.raises(errors.ArgumentTypeError, match="cannot make a codec from class int"):
        resolve_codec(int)


def test_declarations_and_plans() -> None:
    from streamjoin.assignor.model import MemberState
    from streamjoin.runtime.transport.topic_admin import TopicSpec
    from streamjoin.state.restore import plan_restore

    with pytest.raises(errors.ConfigurationError, match="partitions must be >= 1"):
        TopicSpec("t", 0)
    with pytest.raises(errors.InvalidScenarioError, match="member id"):
        MemberState("", frozenset())
    with pytest.raises(errors.ChangelogReadError, match="invalid changelog bounds"):
        plan_restore(None, 5, 3)


def test_userdata_encoding_out_of_range() -> None:
    from streamjoin.assignor.protocol import AssignmentUserdata, encode_assignment

    with pytest.raises(errors.UserdataError, match="generation") as info:
        encode_assignment(AssignmentUserdata(generation=-5))
    assert not isinstance(info.value, errors.UnsupportedUserdataVersion)


async def test_test_driver_errors() -> None:
    from streamjoin.testing.driver import TestDriver

    app = streamjoin.App("errors-app", topic_partitions=2)
    app.topic("words")
    driver = TestDriver(app)
    with pytest.raises(errors.LifecycleError, match="not started"):
        driver.committable()
    async with driver:
        with pytest.raises(errors.UnknownTopicError, match="not declared") as info:
            await driver.put("nope", key=b"k", value="v")
        assert isinstance(info.value, KeyError)
        with pytest.raises(errors.ConfigurationError, match="partition 5 is invalid"):
            await driver.put("words", key=b"k", value="v", partition=5)


def test_unsupported_userdata_version_message() -> None:
    from streamjoin.assignor.protocol import (
        MAJOR_VERSION,
        SubscriptionUserdata,
        decode_subscription,
        encode_subscription,
    )

    data = bytearray(encode_subscription(SubscriptionUserdata()))
    data[3] = MAJOR_VERSION + 1
    with pytest.raises(errors.UnsupportedUserdataVersion, match="this decoder reads major") as info:
        decode_subscription(bytes(data))
    assert (info.value.kind, info.value.major) == ("subscription", MAJOR_VERSION + 1)


def test_folded_variants_raise_their_family_with_their_message() -> None:
    """Failures nobody handles apart are their family's error, the message says which."""
    from aiokafka import TopicPartition

    from streamjoin.joins.core import JoinInput, JoinSpec
    from streamjoin.partitioner import partition_for_key
    from streamjoin.runtime.tasks.offset_ledger import OffsetTracker
    from streamjoin.state.memory import MemoryStorePartition
    from streamjoin.state.windows import TumblingWindows

    with pytest.raises(errors.ArgumentTypeError, match="does not hash null keys"):
        partition_for_key(None, 3)  # type: ignore[arg-type]
    with pytest.raises(errors.ConfigurationError, match="size_ms must be >= 1"):
        TumblingWindows(size_ms=0)
    with pytest.raises(errors.ConfigurationError, match="window_ms must be an int"):
        JoinSpec(-1, 0)
    with pytest.raises(errors.JoinError, match="side must be 'left' or 'right'"):
        JoinInput("middle", b"k", b"v", 0, 0)  # type: ignore[arg-type]
    store = MemoryStorePartition()
    store.close()
    with pytest.raises(errors.StoreError, match="is closed"):
        store.get(b"k")
    with pytest.raises(errors.InternalError, match="acknowledged but not pending"):
        OffsetTracker().ack(TopicPartition("t", 0), 5)
