"""``streamjoin acls``: print the least-privilege ACLs an app's workers need."""

from __future__ import annotations

import click

from streamjoin.acls import kafka_acls_commands, required_acls
from streamjoin.cli_app import _load, _table, app_option

__all__ = ["acls_command"]


@click.command("acls")
@app_option
@click.option(
    "--principal",
    default=None,
    metavar="User:NAME",
    help="Who runs the workers (default: User:<sasl_plain_username of the app's client "
    "options>, else User:APP_ID).",
)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["table", "kafka-acls"]),
    default="table",
    show_default=True,
    help="table: one ACL a line, with why; kafka-acls: kafka-acls.sh commands creating them.",
)
@click.option(
    "--bootstrap-server",
    default="BOOTSTRAP",
    show_default=True,
    help="With --format kafka-acls: the address the commands use.",
)
@click.option(
    "--command-config",
    default="admin.properties",
    show_default=True,
    help="With --format kafka-acls: the admin's client properties file ('' for none).",
)
def acls_command(
    app_spec: str,
    principal: str | None,
    output_format: str,
    bootstrap_server: str,
    command_config: str,
) -> None:
    """Print the ACLs the app's workers need (least privilege), from its declarations.

    READ on input topics, WRITE on outputs, CREATE/READ/WRITE on the app's internal
    topics (prefix APP_ID-), READ on the group APP_ID, and under exactly-once WRITE on
    transactional ids prefixed APP_ID-. docs/security.md explains each.
    """
    app = _load(app_spec, None)
    if principal is None:
        user = app.config.client_options.get("sasl_plain_username")
        principal = f"User:{user if isinstance(user, str) and user else app.id}"
    if not principal.startswith("User:"):
        raise click.BadParameter(f"{principal!r}: expected User:NAME", param_hint="--principal")
    acls = required_acls(app.topology(), app.config, principal)
    if output_format == "kafka-acls":
        for line in kafka_acls_commands(acls, bootstrap_server, command_config or None):
            click.echo(line)
        return
    rows = [("PRINCIPAL", "RESOURCE", "PATTERN", "NAME", "OPERATION", "WHY")]
    for acl in acls:
        rows.append(
            (acl.principal, acl.resource_type, acl.pattern, acl.name, acl.operation, acl.why)
        )
    click.echo(_table(rows))
