"""One error hierarchy: every exception streamjoin defines is a StreamjoinError from
``streamjoin.errors``, one class per failure, with the built-in bases callers relied on."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
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
        "streamjoin.codecs.DecodeError",
        "streamjoin.app.ConfigurationError",
        "streamjoin.state.base.StoreCorrupted",
        "streamjoin.assignor.protocol.MalformedUserdata",
        "streamjoin.runtime.tasks.agent_runtime.AgentFailed",
        "streamjoin.spark.bootstrap_job.UnsupportedTable",
        "streamjoin.testing.kafka.BrokerExitedError",
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


def test_the_package_exports_the_root_and_the_module() -> None:
    assert streamjoin.StreamjoinError is StreamjoinError
    assert streamjoin.errors is errors
    assert {"StreamjoinError", "errors"} <= set(streamjoin.__all__)


def test_one_name_per_class() -> None:
    # a class may be re-exported by many modules, but under its own name only, except the
    # documented aliases of CopartitioningError
    aliases = {
        "streamjoin.runtime.transport.topic_admin.TopicPartitionCountMismatch",
        "streamjoin.spark.backfill_job.PartitioningMismatch",
    }
    by_class: dict[type[BaseException], set[str]] = defaultdict(set)
    for where, classes in FOUND.items():
        for cls in classes:
            by_class[cls].add(where.rsplit(".", 1)[1])
            if where.rsplit(".", 1)[1] != cls.__name__:
                assert where in aliases, f"{where} is another name for {cls.__name__}"
    names = [cls.__name__ for cls in by_class]
    assert len(names) == len(set(names))


def test_copartitioning_has_one_class_under_every_old_name() -> None:
    from streamjoin import spark
    from streamjoin.app import CopartitioningError as from_app
    from streamjoin.runtime.transport.topic_admin import TopicPartitionCountMismatch
    from streamjoin.spark.backfill_job import PartitioningMismatch

    cls = errors.CopartitioningError
    assert from_app is cls
    assert TopicPartitionCountMismatch is cls
    assert PartitioningMismatch is cls
    assert spark.PartitioningMismatch is cls  # lazy attribute of streamjoin.spark
    assert spark.CopartitioningError is cls
    assert issubclass(cls, errors.ConfigurationError)


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (errors.ConfigurationError, ValueError),
        (errors.CopartitioningError, ValueError),
        (errors.ArgumentTypeError, TypeError),
        (errors.NotFoundError, LookupError),
        (errors.AppNotFound, LookupError),
        (errors.UnknownTopicError, KeyError),
        (errors.CodecError, ValueError),
        (errors.DecodeError, ValueError),
        (errors.EncodeError, ValueError),
        (errors.KeyEncodingError, ValueError),
        (errors.WindowError, ValueError),
        (errors.InvalidChangelogBounds, ValueError),
        (errors.ChangelogReadError, RuntimeError),
        (errors.CorruptRecordSet, ValueError),
        (errors.ScanInvalidated, RuntimeError),
        (errors.LifecycleError, RuntimeError),
        (errors.TransportNotReady, RuntimeError),
        (errors.AgentFailed, RuntimeError),
        (errors.TableAccessError, RuntimeError),
        (errors.OffsetTrackingError, RuntimeError),
        (errors.NullKeyError, TypeError),
        (errors.RecordTooLargeError, ValueError),
        (errors.JoinError, ValueError),
        (errors.InvalidScenarioError, ValueError),
        (errors.UserdataError, ValueError),
        (errors.ProvisioningError, RuntimeError),
        (errors.TopicAdminError, RuntimeError),
        (errors.KafkaProvisioningError, RuntimeError),
        (errors.SparkNotInstalled, ImportError),
        (errors.UnsupportedTable, ValueError),
        (errors.NonEmptyChangelog, RuntimeError),
        (errors.ConnectorResolutionError, RuntimeError),
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
    assert issubclass(errors.InvalidJoinSpec, errors.JoinError)
    assert issubclass(errors.InvalidJoinSpec, errors.ConfigurationError)
    assert issubclass(errors.ConnectorResolutionError, errors.SparkJobError)
    assert issubclass(errors.ConnectorResolutionError, errors.ProvisioningError)
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
    with pytest.raises(errors.InvalidChangelogBounds):
        plan_restore(None, 5, 3)


def test_userdata_encoding_out_of_range() -> None:
    from streamjoin.assignor.protocol import (
        AssignmentUserdata,
        MalformedUserdata,
        encode_assignment,
    )

    with pytest.raises(errors.UserdataOutOfRange, match="generation") as info:
        encode_assignment(AssignmentUserdata(generation=-5))
    assert isinstance(info.value, errors.UserdataError)
    assert not isinstance(info.value, MalformedUserdata)


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
