"""Client logins: TLS files, credentials from the environment, Spark's options, refusals
told apart, and the local secured broker's certificates and settings."""

from __future__ import annotations

import asyncio
import pickle
import ssl
from pathlib import Path

import pytest
from aiokafka import errors as kafka_errors

from streamjoin.client_security import (
    FileSSLContext,
    client_kwargs,
    client_options_from_env,
    spark_kafka_options,
)
from streamjoin.config import AppConfig
from streamjoin.errors import AccessRefused, AgentFailed, ConfigurationError, GroupMembershipError
from streamjoin.local_kafka_security import (
    ScramUser,
    TlsFiles,
    make_certificates,
    scram_format_args,
    secure_broker_overrides,
)
from streamjoin.runtime.transport.access import check_login, refusal_of

PASSWORD = "pa55-word"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_certificates(tmp_path_factory.mktemp("tls"))


async def _handshake(tls: TlsFiles, client: ssl.SSLContext, host: str) -> None:
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tls.server_keystore)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    listener = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server)
    port = listener.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client, server_hostname=host
        )
        assert await reader.read() == b"ok"
        writer.close()
    finally:
        listener.close()
        await listener.wait_closed()


async def test_the_certificates_verify_for_loopback_and_localhost_only(tls: TlsFiles) -> None:
    options = client_kwargs({"security_protocol": "SSL", "ssl_cafile": str(tls.ca_file)})
    context = options["ssl_context"]
    assert "ssl_cafile" not in options and isinstance(context, FileSSLContext)
    await _handshake(tls, context, "127.0.0.1")
    await _handshake(tls, context, "localhost")
    with pytest.raises(ssl.SSLCertVerificationError):
        await _handshake(tls, context, "kafka.example.com")
    with pytest.raises(ssl.SSLCertVerificationError) as caught:  # the system's CAs only
        await _handshake(tls, ssl.create_default_context(), "127.0.0.1")
    refused = refusal_of(caught.value)
    assert refused is not None and "could not be verified" in str(refused)


async def test_the_ssl_context_pickles_as_its_files_for_spark_tasks(tls: TlsFiles) -> None:
    context = client_kwargs({"ssl_cafile": tls.ca_file})["ssl_context"]
    copy = pickle.loads(pickle.dumps(context))
    assert isinstance(copy, FileSSLContext) and copy is not context
    await _handshake(tls, copy, "127.0.0.1")


def test_tls_file_options_are_checked(tmp_path: Path, tls: TlsFiles) -> None:
    with pytest.raises(ConfigurationError, match=r"ssl_cafile=.*missing\.pem"):
        client_kwargs({"ssl_cafile": str(tmp_path / "missing.pem")})
    with pytest.raises(ConfigurationError, match="not both"):
        client_kwargs({"ssl_cafile": str(tls.ca_file), "ssl_context": object()})
    with pytest.raises(ConfigurationError, match="ssl_keyfile needs ssl_certfile"):
        client_kwargs({"ssl_keyfile": "k.pem"})
    assert client_kwargs({"security_protocol": "SASL_PLAINTEXT"}) == {
        "security_protocol": "SASL_PLAINTEXT"
    }


def test_the_app_config_builds_the_context_and_hides_the_password(tls: TlsFiles) -> None:
    config = AppConfig(
        "a",
        client_options={
            "security_protocol": "SASL_SSL",
            "sasl_plain_password": PASSWORD,
            "ssl_cafile": str(tls.ca_file),
        },
    )
    assert PASSWORD not in repr(config) and PASSWORD not in str(config.client_options)
    kwargs = config.client_kwargs()
    assert kwargs["sasl_plain_password"] == PASSWORD
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext)


def test_credentials_come_from_the_environment_or_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\nignored\n")
    env = {
        "STREAMJOIN_CLIENT_SECURITY_PROTOCOL": "sasl_ssl",
        "STREAMJOIN_CLIENT_SASL_PLAIN_USERNAME": "alice",
        "STREAMJOIN_CLIENT_SASL_PLAIN_PASSWORD_FILE": str(secret),
        "STREAMJOIN_CLIENT_SSL_CAFILE": "/etc/ca.pem",
        "STREAMJOIN_CLIENT_REQUEST_TIMEOUT_MS": "5000",
        "STREAMJOIN_KAFKA_BOOTSTRAP": "127.0.0.1:9092",  # the test plugin's, not ours
        "HOME": "/root",
    }
    assert client_options_from_env(env) == {
        "security_protocol": "SASL_SSL",
        "sasl_plain_username": "alice",
        "sasl_plain_password": PASSWORD,
        "ssl_cafile": "/etc/ca.pem",
        "request_timeout_ms": 5000,
    }
    assert client_options_from_env({}) == {}


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("STREAMJOIN_CLIENT_SASL_PASWORD", "x", "STREAMJOIN_CLIENT_SASL_PASWORD sets no known"),
        ("STREAMJOIN_CLIENT_SECURITY_PROTOCOL", "TLS", "expected one of"),
        ("STREAMJOIN_CLIENT_SASL_PLAIN_PASSWORD_FILE", "/nonexistent/pw", "cannot read"),
    ],
)
def test_a_bad_variable_is_an_error_naming_it(variable: str, value: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as caught:
        client_options_from_env({variable: value})
    assert PASSWORD not in str(caught.value)


def test_spark_gets_the_same_login_in_the_jvm_clients_names() -> None:
    options = spark_kafka_options(
        {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": "alice",
            "sasl_plain_password": 'p"w',
            "ssl_cafile": "/etc/ca.pem",
        }
    )
    assert options == {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
        'required username="alice" password="p\\"w";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": "/etc/ca.pem",
    }
    assert spark_kafka_options({}) == {}
    plain = spark_kafka_options({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN"})
    assert "PlainLoginModule" in plain["kafka.sasl.jaas.config"]


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (kafka_errors.SaslAuthenticationFailed("invalid credentials"), "refused the login"),
        (kafka_errors.TopicAuthorizationFailedError("out"), "topic 'out'"),
        (kafka_errors.TopicAuthorizationFailedError({"b", "a"}), "topic 'a', 'b'"),
        (kafka_errors.GroupAuthorizationFailedError("app"), "consumer group 'app'"),
        (kafka_errors.TransactionalIdAuthorizationFailed(), "transactional id"),
        (kafka_errors.ClusterAuthorizationFailedError(), "cluster operation"),
        (
            GroupMembershipError("cannot join group 'g': (GROUP_AUTHORIZATION_FAILED from join)"),
            "GROUP_AUTHORIZATION_FAILED",
        ),
    ],
)
def test_refusals_are_told_apart_behind_any_error(error: Exception, said: str) -> None:
    wrapper = AgentFailed("a record was not acknowledged")
    wrapper.__cause__ = error
    for exc in (error, wrapper):
        refused = refusal_of(exc, user="alice")
        assert isinstance(refused, AccessRefused) and said in str(refused)


def test_other_errors_are_not_refusals() -> None:
    assert refusal_of(kafka_errors.KafkaConnectionError("down")) is None
    assert refusal_of(AgentFailed("boom")) is None
    assert refusal_of(GroupMembershipError("cannot join group 'g': INVALID_GROUP_ID")) is None


async def test_plaintext_has_no_login_to_check() -> None:
    await check_login("127.0.0.1:1")  # nothing listens there, and nothing is asked


def test_scram_users_hide_passwords_and_refuse_what_the_format_tool_cannot_take() -> None:
    user = ScramUser("alice", PASSWORD)
    assert PASSWORD not in repr(user) and user.principal == "User:alice"
    assert scram_format_args([user]) == [
        "--add-scram",
        f"SCRAM-SHA-512=[name=alice,password={PASSWORD}]",
    ]
    for bad in (("al ice", "x"), ("alice", "a,b"), ("", "x")):
        with pytest.raises(ConfigurationError):
            ScramUser(*bad)


def test_the_secured_broker_enforces_acls_and_scram_on_the_client_listener_only(
    tls: TlsFiles,
) -> None:
    overrides = secure_broker_overrides(tls)
    assert overrides["allow.everyone.if.no.acl.found"] == "false"
    assert overrides["authorizer.class.name"].endswith("StandardAuthorizer")
    assert overrides["listener.name.client.sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert overrides["listener.name.client.ssl.keystore.location"] == str(tls.server_keystore)
    assert tls.server_keystore.stat().st_mode & 0o077 == 0  # the key is the owner's only
