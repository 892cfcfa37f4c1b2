"""Unit tests for the local schema registry's provisioning logic (no JVM started here)."""

from __future__ import annotations

import io
import socket
import stat
import tarfile
from pathlib import Path

import pytest

from streamjoin import local_registry as registry
from streamjoin.errors import ProvisioningError
from streamjoin.local_registry import LocalRegistry, RegistrySettings
from streamjoin.testing.pytest_plugin import check_loopback_registry_url


def _system_properties(argv: list[str]) -> dict[str, str]:
    pairs = [arg[2:].split("=", 1) for arg in argv if arg.startswith("-D")]
    return {key: value for key, value in pairs}


def test_the_registry_listens_on_loopback_only_on_both_ports() -> None:
    settings = RegistrySettings(port=18081, management_port=19000)
    props = _system_properties(registry.registry_command("java", Path("/r/run.jar"), settings))
    assert props["quarkus.http.host"] == "127.0.0.1"
    assert props["quarkus.http.port"] == "18081"
    assert props["quarkus.management.host"] == "127.0.0.1"
    assert props["quarkus.management.port"] == "19000"
    assert settings.url == "http://127.0.0.1:18081"
    assert settings.ccompat_url == "http://127.0.0.1:18081/apis/ccompat/v7"


def test_the_command_runs_the_launcher_with_a_small_heap_and_in_memory_storage() -> None:
    settings = RegistrySettings(port=18081, management_port=19000)
    argv = registry.registry_command("/jdk/bin/java", Path("/r/quarkus-run.jar"), settings)
    assert argv[0] == "/jdk/bin/java"
    assert "-Xmx256m" in argv
    assert argv[-2:] == ["-jar", "/r/quarkus-run.jar"]
    props = _system_properties(argv)
    assert props["apicurio.storage.kind"] == "sql"
    assert props["apicurio.storage.sql.kind"] == "h2"
    assert props["apicurio.datasource.jdbc.min-size"] == "2"


def test_overrides_come_last_and_win() -> None:
    settings = RegistrySettings(port=18081, management_port=19000)
    argv = registry.registry_command(
        "java",
        Path("run.jar"),
        settings,
        heap="128m",
        overrides={"apicurio.ccompat.legacy-id-mode.enabled": "true", "quarkus.http.port": "1"},
    )
    assert "-Xmx128m" in argv and "-Xmx256m" not in argv
    props = _system_properties(argv)
    assert props["apicurio.ccompat.legacy-id-mode.enabled"] == "true"
    assert props["quarkus.http.port"] == "1"


def test_the_release_archive_is_named_by_its_maven_coordinates(tmp_path: Path) -> None:
    assert registry.distribution_coordinates("3.3.3") == (
        "io.apicurio:apicurio-registry-app:3.3.3:tar.gz:all"
    )
    assert registry.distribution_file_name("3.3.3") == "apicurio-registry-app-3.3.3-all.tar.gz"
    assert registry.registry_dir(tmp_path, "3.3.3") == tmp_path / "apicurio-registry" / "3.3.3"


def test_a_cache_without_its_marker_is_not_used(tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "quarkus-run.jar").write_bytes(b"")
    assert registry.cached_run_jar(app) is None  # an interrupted unpack
    (app / ".complete").write_text("3.3.3\n")
    assert registry.cached_run_jar(app) == app / "quarkus-run.jar"


def test_a_complete_cache_is_used_without_maven(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = registry.registry_dir(tmp_path, "9.9.9") / "app"
    app.mkdir(parents=True)
    (app / "quarkus-run.jar").write_bytes(b"")
    (app / ".complete").write_text("9.9.9\n")
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))  # no mvn to find
    assert registry.resolve_registry("9.9.9", tmp_path) == app / "quarkus-run.jar"


def test_without_maven_and_cache_the_error_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    with pytest.raises(ProvisioningError, match="apt-get install maven"):
        registry.resolve_registry("9.9.9", tmp_path)


def _tar_with(name: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo(name)
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    return buffer.getvalue()


def test_unpacking_refuses_members_outside_the_target(tmp_path: Path) -> None:
    archive = tmp_path / "evil.tar.gz"
    archive.write_bytes(_tar_with("../escaped.txt"))
    with pytest.raises(tarfile.TarError):
        registry._unpack(archive, tmp_path / "out")
    assert not (tmp_path / "escaped.txt").exists()


def test_unpacking_keeps_the_layout(tmp_path: Path) -> None:
    archive = tmp_path / "ok.tar.gz"
    archive.write_bytes(_tar_with("lib/main/a.jar"))
    registry._unpack(archive, tmp_path / "out")
    assert (tmp_path / "out" / "lib" / "main" / "a.jar").read_bytes() == b"hi"


def test_the_first_java_new_enough_is_picked() -> None:
    found = [("/a/java", 11), ("/b/java", 17), ("/c/java", 25)]
    assert registry.pick_java(found, minimum=17) == "/b/java"
    assert registry.pick_java(found, minimum=21) == "/c/java"
    assert registry.pick_java(found, minimum=26) is None


def _fake_java(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_java_home_comes_first_then_path_then_installed_jdks(tmp_path: Path) -> None:
    home = _fake_java(tmp_path / "home" / "bin" / "java")
    on_path = _fake_java(tmp_path / "path" / "java")
    jdk_a = _fake_java(tmp_path / "jvm" / "a-jdk" / "bin" / "java")
    jdk_b = _fake_java(tmp_path / "jvm" / "b-jdk" / "bin" / "java")
    env = {"JAVA_HOME": str(tmp_path / "home"), "PATH": str(tmp_path / "path")}
    assert registry.java_candidates(env, tmp_path / "jvm") == [home, on_path, jdk_a, jdk_b]
    # no JAVA_HOME, the JDK on PATH is one of the installed ones: listed once
    env = {"PATH": str(tmp_path / "jvm" / "b-jdk" / "bin")}
    assert registry.java_candidates(env, tmp_path / "jvm") == [jdk_b, jdk_a]


def _java_saying(path: Path, version: str) -> str:
    java = _fake_java(path)
    path.write_text(f"#!/bin/sh\necho 'openjdk version \"{version}\" 2026-01-20' >&2\n")
    return java


def test_the_registry_runs_on_the_first_java_21_or_newer(tmp_path: Path) -> None:
    old = _java_saying(tmp_path / "path" / "java", "17.0.15")
    new = _java_saying(tmp_path / "jvm" / "temurin-25" / "bin" / "java", "25.0.1")
    env = {"PATH": str(old.rsplit("/", 1)[0])}
    assert registry._first_new_enough_java(env, tmp_path / "jvm") == new


def test_without_java_21_the_error_names_what_was_found(tmp_path: Path) -> None:
    old = _java_saying(tmp_path / "path" / "java", "17.0.15")
    env = {"PATH": str(old.rsplit("/", 1)[0])}
    with pytest.raises(ProvisioningError, match=r"no Java 21\+ found .*\(Java 17\)"):
        registry._first_new_enough_java(env, tmp_path / "jvm")


def test_a_symlinked_java_is_listed_once(tmp_path: Path) -> None:
    jdk = _fake_java(tmp_path / "jvm" / "21-jdk" / "bin" / "java")
    (tmp_path / "jvm" / "default-jdk").symlink_to(tmp_path / "jvm" / "21-jdk")
    assert registry.java_candidates({"PATH": ""}, tmp_path / "jvm") == [jdk]


def test_only_a_lost_port_race_is_worth_a_retry() -> None:
    bind_failure = (  # what Apicurio 3.3.3 (Quarkus 3.33) logs
        "ERROR [io.quarkus.runtime.ApplicationLifecycleManager] (main) Port 38279 seems to be "
        "in use by another process. Quarkus may already be running or the port is used by "
        "another application."
    )
    assert registry.exited_for_a_taken_port(bind_failure)
    too_old = (
        "java.lang.UnsupportedClassVersionError: ... has been compiled by a more recent "
        "version of the Java Runtime (class file version 65.0)"
    )
    assert not registry.exited_for_a_taken_port(too_old)


def test_a_closed_port_does_not_answer() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        assert not registry.registry_answers(f"http://127.0.0.1:{port}", timeout=1)


def test_addresses_are_asked_of_a_running_registry_only() -> None:
    with pytest.raises(ProvisioningError, match="not running"):
        _ = LocalRegistry().ccompat_url


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:8081", "http://localhost:8081/apis/ccompat/v7/", "https://[::1]:8081"],
)
def test_loopback_registry_urls_are_accepted(url: str) -> None:
    assert check_loopback_registry_url(url) == url.rstrip("/")


@pytest.mark.parametrize(
    "url", ["http://10.0.0.5:8081", "http://registry.example.com", "127.0.0.1:8081"]
)
def test_other_registry_urls_are_refused(url: str) -> None:
    with pytest.raises(ProvisioningError, match="loopback"):
        check_loopback_registry_url(url)
