"""The JAR resolver: names, a given folder, and Maven's failures as the user sees them."""

import glob
import os

import pytest

from circuits import jvm
from circuits.daemon import free_port


@pytest.mark.parametrize(
    "name, artifact",
    [
        ("delta-spark_4.2_2.13-4.4.0.jar", "delta-spark_4.2_2.13"),
        ("log4j-1.2-api-2.25.4.jar", "log4j-1.2-api"),
        ("zstd-jni-1.5.7-7.jar", "zstd-jni"),
        ("netty-transport-native-epoll-4.1.118.Final-linux-x86_64.jar", "netty-transport-native-epoll"),
        ("kafka_2.13-4.4.0.jar", "kafka_2.13"),
    ],
)
def test_artifact_names_are_read_from_jar_names(name, artifact):
    assert jvm.artifact_name(name) == artifact


def test_a_given_folder_is_used_as_it_is_and_one_lacking_a_jar_names_it(tmp_path, monkeypatch):
    monkeypatch.setenv(jvm.DIR_ENV, str(tmp_path))
    (tmp_path / "kafka").mkdir()
    for artifact in jvm.KAFKA.artifacts[:-1]:
        _, name, version = artifact.split(":")
        (tmp_path / "kafka" / f"{name}-{version}.jar").write_bytes(b"")
    with pytest.raises(jvm.JarResolutionError, match=r"lacks org\.slf4j:slf4j-api:.*dbsp jars --copy-to"):
        jvm.jars(jvm.KAFKA)
    (tmp_path / "kafka" / "slf4j-api-2.0.17.jar").write_bytes(b"")
    assert len(jvm.jars(jvm.KAFKA)) == len(jvm.KAFKA.artifacts)


@pytest.mark.slow
def test_an_artifact_maven_cannot_find_is_named_with_the_repository_and_what_to_set(tmp_path, monkeypatch):
    monkeypatch.setenv(jvm.CACHE_ENV, str(tmp_path))
    missing = jvm.JarSet("nothing", ("io.delta:no-such-artifact_2.13:0.0.1",))
    with pytest.raises(jvm.JarResolutionError) as failed:
        jvm.jars(missing, progress=lambda _: None)
    message = str(failed.value)
    assert "io.delta:no-such-artifact_2.13" in message and "central" in message, message
    assert jvm.REPOSITORY_ENV in message and jvm.DIR_ENV in message
    assert not [p for p in os.listdir(tmp_path) if os.path.isdir(tmp_path / p)]  # nothing half resolved is kept


@pytest.mark.slow
def test_an_unreachable_mirror_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv(jvm.CACHE_ENV, str(tmp_path))
    mirror = f"http://127.0.0.1:{free_port()}/maven2"
    monkeypatch.setenv(jvm.REPOSITORY_ENV, mirror)
    with pytest.raises(jvm.JarResolutionError, match=rf"from {mirror}: .*{mirror}"):
        jvm.jars(jvm.JarSet("mirrored", ("io.delta:delta-storage:4.4.0",)), progress=lambda _: None)


def test_the_decoder_is_compiled_once_and_a_machine_without_javac_is_told_what_to_install(tmp_path, monkeypatch):
    import zipfile

    monkeypatch.setenv(jvm.CACHE_ENV, str(tmp_path / "cache"))
    said: list[str] = []
    path = jvm.decoder_jar(progress=said.append)
    assert "dbsp/RecordDecoder.class" in zipfile.ZipFile(path).namelist()
    assert jvm.decoder_jar(progress=said.append) == path and len(said) == 1  # cached: compiled once
    monkeypatch.setenv(jvm.CACHE_ENV, str(tmp_path / "other"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no javac there
    with pytest.raises(jvm.JarResolutionError, match="javac, which is not on PATH: install a Java 17 JDK"):
        jvm.decoder_jar(progress=said.append)


def test_hadoop_aws_is_pinned_at_the_hadoop_of_the_pyspark_wheel():
    wheel = glob.glob(os.path.join(jvm._pyspark_jars_dir(), "hadoop-client-api-*.jar"))
    assert [os.path.basename(j) for j in wheel] == [f"hadoop-client-api-{jvm.HADOOP_VERSION}.jar"]
    assert f"org.apache.hadoop:hadoop-aws:{jvm.HADOOP_VERSION}" in jvm.SPARK.artifacts
