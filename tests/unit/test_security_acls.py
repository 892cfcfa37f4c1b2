"""The ACLs an app needs, computed from its declarations, and how they are printed."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import streamjoin
from streamjoin.acls import Acl, kafka_acls_commands, required_acls
from streamjoin.errors import ConfigurationError

P = "User:alice"


def _app(guarantee: str = "at_least_once") -> streamjoin.App:
    app = streamjoin.App("orders-app", processing_guarantee=guarantee)
    orders = app.topic("orders", partitions=4)
    enriched = app.topic("enriched", partitions=4)
    dead = app.topic("orders-dead", partitions=4)
    counts = app.table("counts", default=int, copartitioned_with=orders)

    @app.agent(orders, on_error="dead_letter", dead_letter=dead)
    async def count(stream):  # type: ignore[no-untyped-def]
        async for event in stream:
            counts[event.key] += 1
            await enriched.send(key=event.key, value=counts[event.key])

    return app


def _by_resource(acls: list[Acl]) -> dict[tuple[str, str, str], set[str]]:
    out: dict[tuple[str, str, str], set[str]] = {}
    for acl in acls:
        assert acl.principal == P
        out.setdefault((acl.resource_type, acl.pattern, acl.name), set()).add(acl.operation)
    return out


def test_an_app_gets_read_on_inputs_write_on_outputs_and_its_prefix_and_group() -> None:
    app = _app()
    assert _by_resource(required_acls(app.topology(), app.config, P)) == {
        ("TOPIC", "LITERAL", "orders"): {"READ", "DESCRIBE_CONFIGS"},
        ("TOPIC", "LITERAL", "enriched"): {"WRITE", "DESCRIBE_CONFIGS"},
        ("TOPIC", "LITERAL", "orders-dead"): {"WRITE", "DESCRIBE_CONFIGS"},
        ("TOPIC", "PREFIXED", "orders-app-"): {"CREATE", "READ", "WRITE", "DESCRIBE_CONFIGS"},
        ("GROUP", "LITERAL", "orders-app"): {"READ"},
    }


def test_exactly_once_adds_write_on_the_transactional_ids_prefix_only() -> None:
    alo, eos = _app(), _app("exactly_once")
    extra = set(required_acls(eos.topology(), eos.config, P)) - set(
        required_acls(alo.topology(), alo.config, P)
    )
    assert {(a.resource_type, a.pattern, a.name, a.operation) for a in extra} == {
        ("TRANSACTIONAL_ID", "PREFIXED", "orders-app-", "WRITE")
    }


def test_internal_topics_are_covered_by_the_prefix_not_listed_one_by_one() -> None:
    app = _app()
    names = {a.name for a in required_acls(app.topology(), app.config, P)}
    assert "orders-app-counts-changelog" in app.topology().topics
    assert "orders-app-counts-changelog" not in names


def test_kafka_acls_commands_group_operations_per_resource() -> None:
    app = _app("exactly_once")
    lines = kafka_acls_commands(required_acls(app.topology(), app.config, P), "h:9093")
    assert (
        "kafka-acls.sh --bootstrap-server h:9093 --command-config admin.properties --add "
        "--allow-principal User:alice --operation Create --operation DescribeConfigs "
        "--operation Read --operation Write --topic orders-app- --resource-pattern-type prefixed"
    ) in lines
    assert any(
        "--operation Write --transactional-id orders-app- --resource-pattern-type prefixed" in line
        for line in lines
    )
    assert any(line.endswith("--operation Read --group orders-app") for line in lines)
    assert len(lines) == 6  # one per resource


@pytest.mark.parametrize(
    ("kind", "pattern", "principal"),
    [("USER", "LITERAL", P), ("TOPIC", "MATCH", P), ("TOPIC", "LITERAL", "alice")],
)
def test_a_malformed_acl_is_refused_naming_the_field(
    kind: str, pattern: str, principal: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Acl(kind, pattern, "t", "READ", principal)
    assert any(word in str(caught.value) for word in ("resource type", "pattern", "principal"))


def test_the_acls_command_prints_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamjoin import cli_acls

    app = _app()
    monkeypatch.setattr(cli_acls, "_load", lambda spec, broker: app)
    table = CliRunner().invoke(cli_acls.acls_command, ["-A", "x:app", "--principal", P])
    assert table.exit_code == 0, table.output
    assert "TRANSACTIONAL_ID" not in table.output
    assert "PREFIXED  orders-app-" in table.output and "internal topics" in table.output
    commands = CliRunner().invoke(
        cli_acls.acls_command, ["-A", "x:app", "--format", "kafka-acls", "--command-config", ""]
    )
    assert commands.exit_code == 0, commands.output
    assert "--allow-principal User:orders-app" in commands.output  # no user configured
    assert "--command-config" not in commands.output
    refused = CliRunner().invoke(cli_acls.acls_command, ["-A", "x:app", "--principal", "bob"])
    assert refused.exit_code == 2 and "User:NAME" in refused.output
