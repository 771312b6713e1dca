"""The JVM artifacts the engine runs, resolved once from a Maven repository.

Two sets, each at versions pinned to match each other and the installed PySpark:

- :data:`SPARK`, on the Spark Connect server's (or a classic driver's) classpath: Delta
  Lake's Spark connector (``delta-spark``, built per Spark minor version), Spark's own
  Kafka source (``spark-sql-kafka-0-10``) and Hadoop's S3 file system (``hadoop-aws``, at
  the Hadoop version of the wheel's ``hadoop-client-api``, with the AWS SDK's bundle: a
  store on S3 is read through it), less what the PySpark wheel ships already;
- :data:`KAFKA`, the embedded Apache Kafka broker with a Log4j 2 backend (its POM brings
  none).

Beside them, :func:`decoder_jar` compiles the engine's own JVM code (``circuits/java``: the
Kafka records' decoder, :mod:`sensors.decode`) with the JDK's ``javac`` against the PySpark
wheel's JARs, once per source and Spark version, into the same cache.

:func:`jars` returns a set's JAR files.  The first call on a machine runs Maven
(``mvn dependency:copy-dependencies`` on a small POM; Maven keeps the artifacts in its own
``~/.m2``) and copies the set into the cache (``$DBSP_JARS_CACHE``, by default
``~/.cache/dbsp/jars``), one folder per set and versions; every later call finds that
folder and runs nothing.  Machines behind a proxy set ``DBSP_MAVEN_REPOSITORY`` (a
mirror of Maven Central) or ``DBSP_JARS_DIR`` (a folder with a ``spark/`` and a
``kafka/`` folder of JARs, used as they are; ``dbsp jars --copy-to DIR`` fills one).

Spark-free: the gateway's corner of ``circuits`` may import it.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from xml.sax.saxutils import escape

from .daemon import locked
from .errors import DbspError

SPARK_VERSION = importlib.metadata.version("pyspark")
DELTA_VERSION = importlib.metadata.version("delta-spark")
HADOOP_VERSION = "3.5.0"
"""The Hadoop of the PySpark wheel (its ``jars/hadoop-client-api-<version>.jar``), which
``hadoop-aws`` must match (tests/circuits/test_jvm.py checks)."""
KAFKA_VERSION = "4.4.0"
LOG4J_VERSION = "2.25.4"

JAVA_SOURCES = os.path.join(os.path.dirname(__file__), "java")
CACHE_ENV = "DBSP_JARS_CACHE"
DIR_ENV = "DBSP_JARS_DIR"
REPOSITORY_ENV = "DBSP_MAVEN_REPOSITORY"


class JarResolutionError(DbspError):
    """The JARs of a set could not be had: Maven failed, or is missing, or a given folder lacks them."""


@dataclass(frozen=True)
class JarSet:
    """Maven artifacts (``group:artifact:version``) resolved with their runtime dependencies,
    less the JARs whose artifact names are in ``provided`` (a classpath they join)."""

    name: str
    artifacts: tuple[str, ...]
    provided: Callable[[], set[str]] = set

    def key(self, repository: str | None) -> str:
        text = "\n".join([*self.artifacts, *sorted(self.provided()), repository or ""])
        return f"{self.name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def _pyspark_jars_dir() -> str:
    """The folder of the JARs the PySpark wheel ships."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    assert spec is not None and spec.origin is not None
    return os.path.join(os.path.dirname(spec.origin), "jars")


def _pyspark_jars() -> set[str]:
    return {artifact_name(p) for p in glob.glob(os.path.join(_pyspark_jars_dir(), "*.jar"))}


_SPARK_MINOR = ".".join(SPARK_VERSION.split(".")[:2])
SPARK = JarSet(
    "spark",
    (
        f"io.delta:delta-spark_{_SPARK_MINOR}_2.13:{DELTA_VERSION}",
        f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_VERSION}",
        f"org.apache.hadoop:hadoop-aws:{HADOOP_VERSION}",
    ),
    _pyspark_jars,
)
KAFKA = JarSet(
    "kafka",
    (
        f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}",
        f"org.apache.logging.log4j:log4j-core:{LOG4J_VERSION}",
        f"org.apache.logging.log4j:log4j-slf4j2-impl:{LOG4J_VERSION}",
        # Kafka's POM brings SLF4J 1.7, which cannot bind Log4j 2's SLF4J 2 backend.
        "org.slf4j:slf4j-api:2.0.17",
    ),
)


def artifact_name(path: str) -> str:
    """The artifact of a JAR named as Maven copies it, ``<artifact>-<version>[-<classifier>].jar``:
    the version is the last part that starts with a digit after a part that does not
    (``log4j-1.2-api-2.25.4``, ``zstd-jni-1.5.7-7``)."""
    parts = os.path.basename(path).removesuffix(".jar").split("-")
    starts = [i for i in range(1, len(parts)) if parts[i][:1].isdigit() and not parts[i - 1][:1].isdigit()]
    return "-".join(parts[: starts[-1]]) if starts else "-".join(parts)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def jars(jar_set: JarSet, progress: Callable[[str], None] = _stderr) -> list[str]:
    """The JAR files of ``jar_set``, resolving them first if this machine has not (see the module)."""
    given = os.environ.get(DIR_ENV)
    if given:
        return _given(jar_set, given)
    repository = os.environ.get(REPOSITORY_ENV) or None
    folder = os.path.join(cache_dir(), jar_set.key(repository))
    if not os.path.isdir(folder):
        os.makedirs(cache_dir(), exist_ok=True)
        with locked(folder + ".lock"):
            if not os.path.isdir(folder):
                _resolve(jar_set, folder, repository, progress)
    return sorted(glob.glob(os.path.join(folder, "*.jar")))


def cache_dir() -> str:
    return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "dbsp", "jars")


def decoder_jar(progress: Callable[[str], None] = _stderr) -> str:
    """The JAR of the engine's Java classes (``circuits/java``), compiled on first use."""
    sources = sorted(glob.glob(os.path.join(JAVA_SOURCES, "**", "*.java"), recursive=True))
    digest = hashlib.sha256(SPARK_VERSION.encode())
    for path in sources:
        with open(path, "rb") as f:
            digest.update(f.read())
    path = os.path.join(cache_dir(), f"decoder-{digest.hexdigest()[:12]}", "dbsp-decoder.jar")
    if not os.path.exists(path):
        os.makedirs(cache_dir(), exist_ok=True)
        with locked(os.path.dirname(path) + ".lock"):
            if not os.path.exists(path):
                _compile(sources, path, progress)
    return path


def _compile(sources: list[str], path: str, progress: Callable[[str], None]) -> None:
    javac = shutil.which("javac")
    if javac is None:
        raise JarResolutionError(
            "the engine compiles its Kafka record decoder (circuits/java) with javac, which is not on PATH: "
            "install a Java 17 JDK (apt-get install openjdk-17-jdk-headless)"
        )
    progress(f"compiling the engine's record decoder (once; cached in {os.path.dirname(path)})")
    spark_jars = os.path.join(_pyspark_jars_dir(), "*")
    work = tempfile.mkdtemp(prefix=".decoder-", dir=cache_dir())
    try:
        command = [javac, "--release", "17", "-nowarn", "-cp", spark_jars, "-d", work, *sources]
        done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise JarResolutionError(f"javac failed on the engine's Java sources: {done.stderr.strip()[-2000:]}")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        partial = path + ".partial"
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
            for found in glob.glob(os.path.join(work, "**", "*.class"), recursive=True):
                jar.write(found, os.path.relpath(found, work))
        os.rename(partial, path)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _given(jar_set: JarSet, root: str) -> list[str]:
    folder = os.path.join(root, jar_set.name)
    found = sorted(glob.glob(os.path.join(folder, "*.jar")))
    names = {artifact_name(p) for p in found}
    missing = [a for a in jar_set.artifacts if a.split(":")[1] not in names]
    if missing:
        raise JarResolutionError(
            f"{DIR_ENV}={root}: {folder} lacks {', '.join(missing)}; fill it on a machine that reaches Maven "
            f"Central with `dbsp jars --copy-to {root}`, or unset {DIR_ENV} to resolve them with Maven"
        )
    return found


def _resolve(jar_set: JarSet, folder: str, repository: str | None, progress: Callable[[str], None]) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarResolutionError(
            f"the engine needs {', '.join(jar_set.artifacts)} and resolves them with Maven, which is not on PATH: "
            f"install it (apt-get install maven), or set {DIR_ENV} to a folder holding them"
        )
    where = repository or "Maven Central"
    progress(f"resolving {', '.join(jar_set.artifacts)} from {where} (once; cached in {cache_dir()})")
    started = time.monotonic()
    work = tempfile.mkdtemp(prefix=f".{jar_set.name}-", dir=cache_dir())
    try:
        command = [mvn, "-B", "-f", _write_pom(work, jar_set), "dependency:copy-dependencies"]
        command += ["-DincludeScope=runtime", f"-DoutputDirectory={os.path.join(work, 'jars')}"]
        if repository:
            command += ["-s", _write_settings(work, repository)]
        log = os.path.join(cache_dir(), f"{jar_set.name}-mvn.log")
        with open(log, "w") as out:
            done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise JarResolutionError(_failure(jar_set, where, log))
        provided = jar_set.provided()
        for path in glob.glob(os.path.join(work, "jars", "*.jar")):
            if artifact_name(path) in provided:
                os.remove(path)
        os.rename(os.path.join(work, "jars"), folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    count = len(glob.glob(os.path.join(folder, "*.jar")))
    progress(f"resolved {count} JARs for {jar_set.name} in {time.monotonic() - started:.0f} s: {folder}")


def _write_pom(work: str, jar_set: JarSet) -> str:
    dependencies = "".join(
        f"<dependency><groupId>{escape(g)}</groupId><artifactId>{escape(a)}</artifactId>"
        f"<version>{escape(v)}</version></dependency>"
        for g, a, v in (artifact.split(":") for artifact in jar_set.artifacts)
    )
    path = os.path.join(work, "pom.xml")
    with open(path, "w") as f:
        f.write(
            '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
            f"<groupId>dbsp</groupId><artifactId>dbsp-{jar_set.name}</artifactId><version>1</version>"
            f"<packaging>pom</packaging><dependencies>{dependencies}</dependencies></project>\n"
        )
    return path


def _write_settings(work: str, repository: str) -> str:
    path = os.path.join(work, "settings.xml")
    with open(path, "w") as f:
        f.write(
            "<settings><mirrors><mirror><id>dbsp-mirror</id><mirrorOf>*</mirrorOf>"
            f"<url>{escape(repository)}</url></mirror></mirrors></settings>\n"
        )
    return path


def _failure(jar_set: JarSet, where: str, log: str) -> str:
    with open(log, errors="replace") as f:
        errors = [line.removeprefix("[ERROR]").strip() for line in f if line.startswith("[ERROR]")]
    seen = next((e for e in errors if e), "Maven failed without an error line")
    return (
        f"cannot resolve {', '.join(jar_set.artifacts)} from {where}: {seen}; "
        f"set {REPOSITORY_ENV} to a reachable mirror of Maven Central, or {DIR_ENV} to a folder holding the JARs "
        f"(Maven's full output: {log})"
    )


def copy_to(root: str, progress: Callable[[str], None] = _stderr) -> list[str]:
    """Copies every set's JARs into ``root/<set>/``, the folder ``DBSP_JARS_DIR`` names on another machine."""
    written = []
    for jar_set in (SPARK, KAFKA):
        folder = os.path.join(root, jar_set.name)
        os.makedirs(folder, exist_ok=True)
        for path in jars(jar_set, progress) + ([decoder_jar(progress)] if jar_set is SPARK else []):
            shutil.copy2(path, folder)
        written.append(folder)
    return written
