"""Unit tests for the local-broker provisioning logic (no JVM started here)."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from streamjoin import local_kafka as kafka
from streamjoin.errors import KafkaProvisioningError
from streamjoin.local_kafka import BrokerSettings, LocalKafka
from streamjoin.testing.pytest_plugin import check_loopback_bootstrap, topic_name_for


def _props(text: str) -> dict[str, str]:
    pairs = [line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#")]
    return {k: v for k, v in pairs}


def test_server_properties_single_node_kraft_on_loopback(tmp_path: Path) -> None:
    settings = BrokerSettings(
        client_port=19092, internal_port=19094, controller_port=19093, log_dir=tmp_path / "d"
    )
    props = _props(kafka.render_server_properties(settings))
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert props["listeners"] == (
        "CLIENT://127.0.0.1:19092,INTERNAL://127.0.0.1:19094,CONTROLLER://127.0.0.1:19093"
    )
    assert props["advertised.listeners"] == "CLIENT://127.0.0.1:19092,INTERNAL://127.0.0.1:19094"
    assert props["inter.broker.listener.name"] == "INTERNAL"
    assert props["controller.listener.names"] == "CONTROLLER"
    assert props["listener.security.protocol.map"] == (
        "CLIENT:PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT"
    )
    assert props["log.dirs"] == str(tmp_path / "d")
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["transaction.state.log.replication.factor"] == "1"
    assert props["transaction.state.log.min.isr"] == "1"
    assert props["auto.create.topics.enable"] == "false"
    assert settings.bootstrap_servers == "127.0.0.1:19092"
    assert settings.internal_bootstrap_servers == "127.0.0.1:19094"


def test_advertised_client_port_and_secured_client_listener(tmp_path: Path) -> None:
    """A fault proxy's port is what clients are told; INTERNAL stays direct and PLAINTEXT."""
    settings = BrokerSettings(
        client_port=19092,
        internal_port=19094,
        controller_port=19093,
        log_dir=tmp_path,
        advertised_client_port=29092,
        client_protocol="SASL_SSL",
    )
    props = _props(kafka.render_server_properties(settings))
    assert props["listeners"].startswith("CLIENT://127.0.0.1:19092,")
    assert props["advertised.listeners"] == "CLIENT://127.0.0.1:29092,INTERNAL://127.0.0.1:19094"
    assert props["listener.security.protocol.map"] == (
        "CLIENT:SASL_SSL,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT"
    )
    assert settings.bootstrap_servers == "127.0.0.1:29092"


def test_node_of_a_quorum_lists_every_voter(tmp_path: Path) -> None:
    settings = BrokerSettings(
        client_port=1,
        internal_port=2,
        controller_port=3,
        log_dir=tmp_path,
        node_id=2,
        quorum={3: 13, 1: 11, 2: 3},
    )
    props = _props(kafka.render_server_properties(settings))
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:11,2@127.0.0.1:3,3@127.0.0.1:13"


def test_server_properties_overrides_win(tmp_path: Path) -> None:
    settings = BrokerSettings(
        client_port=1,
        internal_port=3,
        controller_port=2,
        log_dir=tmp_path,
        overrides={"auto.create.topics.enable": "true", "message.max.bytes": "2000000"},
    )
    props = _props(kafka.render_server_properties(settings))
    assert props["auto.create.topics.enable"] == "true"
    assert props["message.max.bytes"] == "2000000"


def test_client_protocol_is_checked() -> None:
    assert kafka.check_client_protocol("sasl_ssl") == "SASL_SSL"
    with pytest.raises(KafkaProvisioningError, match=r"'TLS' is not a Kafka security protocol"):
        LocalKafka(client_protocol="TLS")


def test_saved_ports_old_and_new_formats() -> None:
    assert kafka.parse_saved_ports("21000 21001 21002\n") == (21000, 21001, 21002)
    # a data dir kept by an older version: two ports, the internal one is picked afresh
    assert kafka.parse_saved_ports("21000 21001\n") == (21000, 21001, None)
    for bad in ("", "21000", "a b", "1 2 3 4", "21000 21000"):
        assert kafka.parse_saved_ports(bad) is None


def test_kept_two_port_file_keeps_its_ports(tmp_path: Path) -> None:
    old_client = kafka.free_port()
    old_controller = kafka.free_port(exclude=frozenset({old_client}))
    (tmp_path / kafka.PORTS_FILE).write_text(f"{old_client} {old_controller}\n")
    broker = LocalKafka(data_dir=tmp_path)
    broker.workdir = tmp_path
    client, controller, internal = broker._choose_ports()
    assert (client, controller) == (old_client, old_controller)
    assert internal not in (client, controller)


def test_advertise_is_asked_once_per_client_port() -> None:
    calls: list[tuple[int, int]] = []

    def advertise(node_id: int, port: int) -> int:
        calls.append((node_id, port))
        return port + 1

    broker = LocalKafka(advertise=advertise, node_id=3)
    assert broker._advertised_port(20000) == 20001
    assert broker._advertised_port(20000) == 20001
    assert broker._advertised_port(20500) == 20501
    assert calls == [(3, 20000), (3, 20500)]


def test_pom_names_the_broker_artifact_and_version() -> None:
    pom = kafka.render_pom("4.3.0")
    assert "<artifactId>kafka_2.13</artifactId>" in pom
    assert "<version>4.3.0</version>" in pom
    assert "log4j-slf4j-impl" in pom


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('java version "1.8.0_381"', 8),
        ('openjdk version "21" 2023-09-19', 21),
    ],
)
def test_parse_java_major(output: str, major: int) -> None:
    assert kafka.parse_java_major(output) == major


def test_parse_java_major_rejects_garbage() -> None:
    with pytest.raises(KafkaProvisioningError, match="could not read the Java version"):
        kafka.parse_java_major("command not found")


def test_free_port_is_bindable_and_honours_exclusions() -> None:
    first = kafka.free_port()
    second = kafka.free_port(exclude=frozenset({first}))
    assert second != first
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", second))


def test_cluster_id_is_22_char_urlsafe() -> None:
    ids = {kafka.new_cluster_id() for _ in range(2000)}
    assert len(ids) == 2000
    for cid in ids:
        assert len(cid) == 22
        assert set(cid) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        # the storage tool would read a leading "-" as an option (1 id in 64 without the check)
        assert not cid.startswith("-")


def test_cache_dir_precedence(tmp_path: Path) -> None:
    assert kafka.default_cache_dir({"STREAMJOIN_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert kafka.default_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "streamjoin"
    libs = kafka.kafka_libs_dir(tmp_path, "4.3.0")
    assert libs == tmp_path / "kafka" / "2.13-4.3.0" / "libs"


def test_missing_java_names_what_to_install(tmp_path: Path) -> None:
    with pytest.raises(KafkaProvisioningError, match="apt-get install openjdk-17-jre-headless"):
        kafka.find_java({"PATH": str(tmp_path)})


def _fake_executable(path: Path, script: str) -> Path:
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_too_old_java_is_rejected(tmp_path: Path) -> None:
    _fake_executable(tmp_path / "java", "echo 'java version \"1.8.0_1\"' >&2\n")
    with pytest.raises(KafkaProvisioningError, match="is Java 8"):
        kafka.find_java({"PATH": str(tmp_path)})


def test_java_home_takes_precedence(tmp_path: Path) -> None:
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    java = _fake_executable(home / "bin" / "java", "echo 'openjdk version \"21.0.1\"' >&2\n")
    assert kafka.find_java({"JAVA_HOME": str(home), "PATH": ""}) == str(java)


def test_missing_maven_names_what_to_install(tmp_path: Path) -> None:
    with pytest.raises(KafkaProvisioningError, match="apt-get install maven"):
        kafka.find_maven({"PATH": str(tmp_path)})


def test_cached_jars_are_reused_without_maven(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    libs = kafka.kafka_libs_dir(tmp_path, "9.9.9")
    libs.mkdir(parents=True)
    (libs / "kafka_2.13-9.9.9.jar").write_bytes(b"")
    (libs / ".complete").write_text("9.9.9\n")

    def no_maven(*_: object, **__: object) -> str:
        raise AssertionError("maven must not run when the cache is complete")

    monkeypatch.setattr(kafka, "find_maven", no_maven)
    assert kafka.resolve_kafka("9.9.9", tmp_path) == [libs / "kafka_2.13-9.9.9.jar"]


def test_incomplete_cache_is_not_trusted(tmp_path: Path) -> None:
    libs = kafka.kafka_libs_dir(tmp_path, "9.9.9")
    libs.mkdir(parents=True)
    (libs / "kafka_2.13-9.9.9.jar").write_bytes(b"")
    assert kafka.cached_classpath(libs) is None


def test_failed_resolution_reports_maven_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mvn = _fake_executable(tmp_path / "mvn", "echo 'Could not resolve dependencies' ; exit 1\n")
    monkeypatch.setattr(kafka, "find_maven", lambda *a, **k: str(mvn))
    with pytest.raises(KafkaProvisioningError, match="Could not resolve dependencies"):
        kafka.resolve_kafka("0.0.0-nope", tmp_path / "cache")
    assert not (kafka.kafka_libs_dir(tmp_path / "cache", "0.0.0-nope") / ".complete").exists()


def test_start_without_java_fails_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    broker = LocalKafka(cache_dir=tmp_path)
    with pytest.raises(KafkaProvisioningError, match="Java was not found"):
        broker.start()
    assert not broker.running


def test_bootstrap_servers_before_start_is_an_error() -> None:
    with pytest.raises(KafkaProvisioningError, match="not running"):
        _ = LocalKafka().bootstrap_servers


def test_java_command_shape(tmp_path: Path) -> None:
    cmd = kafka.java_command(
        "/usr/bin/java", [tmp_path / "a.jar", tmp_path / "b.jar"], "kafka.Kafka", ["x.properties"]
    )
    assert cmd[0] == "/usr/bin/java"
    cp = cmd[cmd.index("-cp") + 1]
    assert cp == os.pathsep.join([str(tmp_path / "a.jar"), str(tmp_path / "b.jar")])
    assert cmd[-2:] == ["kafka.Kafka", "x.properties"]


@pytest.mark.parametrize("bootstrap", ["127.0.0.1:9092", "localhost:1,127.0.0.2:2", "[::1]:9092"])
def test_loopback_bootstrap_accepted(bootstrap: str) -> None:
    assert check_loopback_bootstrap(bootstrap) == bootstrap


@pytest.mark.parametrize("bootstrap", ["10.0.0.5:9092", "kafka.example.com:9092"])
def test_non_loopback_bootstrap_refused(bootstrap: str) -> None:
    with pytest.raises(KafkaProvisioningError, match="loopback"):
        check_loopback_bootstrap(bootstrap)


def test_topic_names_are_legal_and_unique() -> None:
    names = {topic_name_for("test_x[param/1 2]", "clicks", i) for i in range(3)}
    assert len(names) == 3
    for name in names:
        assert name.startswith("clicks-test_x-param-1-2-")
        assert all(c.isalnum() or c in "._-" for c in name)


def test_port_range_parsing_and_the_fallback(tmp_path: Path) -> None:
    assert kafka.parse_port_range("32768\t60999\n") == (32768, 60999)
    for bad in ("", "1 2 3", "a b", "70000 70001", "500 100"):
        assert kafka.parse_port_range(bad) is None
    proc = tmp_path / "ip_local_port_range"
    proc.write_text("20000 50000\n")
    assert kafka.ephemeral_port_range(proc) == (20000, 50000)
    assert kafka.ephemeral_port_range(tmp_path / "missing") == kafka.DEFAULT_EPHEMERAL_RANGE
    proc.write_text("garbage\n")
    assert kafka.ephemeral_port_range(proc) == kafka.DEFAULT_EPHEMERAL_RANGE


def test_listen_ports_stay_outside_the_ephemeral_range() -> None:
    assert kafka.listen_port_candidates((32768, 60999)) == range(10000, 30001)
    assert kafka.listen_port_candidates((20000, 60999)) == range(10000, 20000)
    # an ephemeral range starting very low leaves the ports above it
    assert kafka.listen_port_candidates((1024, 50000)) == range(50001, 65536)
    with pytest.raises(KafkaProvisioningError, match="outside the ephemeral range"):
        kafka.listen_port_candidates((1024, 65535))
    low, high = kafka.ephemeral_port_range()
    for _ in range(20):
        assert not low <= kafka.free_port() <= high


def test_a_taken_port_is_never_picked() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        taken = sock.getsockname()[1]
        sock.listen()
        assert not kafka.port_is_free(taken)
        with pytest.raises(KafkaProvisioningError, match="no free TCP port"):
            kafka.free_port(candidates=range(taken, taken + 1))


def test_stored_cluster_id_is_read_from_meta_properties(tmp_path: Path) -> None:
    assert kafka.stored_cluster_id(tmp_path) is None
    (tmp_path / "meta.properties").write_text(
        "#\nnode.id=1\ndirectory.id=pKpOEx4tU70uTjY3PUWOGQ\nversion=1\n"
        "cluster.id=7zyIX6IQTrucA83diNelwQ\n"
    )
    assert kafka.stored_cluster_id(tmp_path) == "7zyIX6IQTrucA83diNelwQ"
    (tmp_path / "meta.properties").write_text("node.id=1\n")
    with pytest.raises(KafkaProvisioningError, match=r"has no cluster\.id"):
        kafka.stored_cluster_id(tmp_path)


def test_class_data_archive_is_used_once_written(tmp_path: Path) -> None:
    java = _fake_executable(tmp_path / "java", "exit 0\n")
    archive = kafka.class_data_archive(tmp_path / "cache", "4.3.0", str(java))
    assert archive.parent == kafka.kafka_libs_dir(tmp_path / "cache", "4.3.0").parent
    assert archive != kafka.class_data_archive(tmp_path / "cache", "4.2.0", str(java))
    scratch = tmp_path / "scratch.jsa"
    assert f"-XX:ArchiveClassesAtExit={scratch}" in kafka.class_data_flags(archive, scratch)
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"cds")
    flags = kafka.class_data_flags(archive, scratch)
    assert f"-XX:SharedArchiveFile={archive}" in flags
    assert not any(f.startswith("-XX:ArchiveClassesAtExit") for f in flags)


def test_the_archive_a_stopped_broker_wrote_is_kept_atomically(tmp_path: Path) -> None:
    final = tmp_path / "broker-cds-x.jsa"
    broker = LocalKafka(cache_dir=tmp_path)
    broker._archive_scratch = tmp_path / "broker-cds-x.jsa.1234abcd.tmp"
    broker._archive_scratch.write_bytes(b"first")
    broker.stop()
    assert final.read_bytes() == b"first"
    assert not broker.writes_class_data_archive
    # a second broker finishing later leaves the first archive alone
    broker._archive_scratch = tmp_path / "broker-cds-x.jsa.5678abcd.tmp"
    broker._archive_scratch.write_bytes(b"second")
    broker.kill()
    assert final.read_bytes() == b"first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broker-cds-x.jsa"]


def test_fast_start_flags_only_when_asked(tmp_path: Path) -> None:
    java = str(_fake_executable(tmp_path / "java", "exit 0\n"))
    assert "-XX:+UseG1GC" in LocalKafka(cache_dir=tmp_path)._jvm_flags(java)
    fast = LocalKafka(cache_dir=tmp_path, fast_start=True)._jvm_flags(java)
    assert "-XX:TieredStopAtLevel=1" in fast and "-XX:+UseG1GC" not in fast
