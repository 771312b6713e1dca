"""Dagster resources: where steps run (Spark), where state lives (the store root), and
where input comes from (Kafka).  Secrets are read from the environment with ``EnvVar``.
"""

from __future__ import annotations

from dagster import ConfigurableResource, EnvVar
from pydantic import ConfigDict, Field, ValidationError
from pyspark.sql import SparkSession

from circuits.spark import connect_server, remote_session, session
from sensors.delta_source import DeltaTables, catalog_tables, table_path
from sensors.ingest import KafkaSource, Sources
from sensors.upstream import UpstreamViews, view_name

from .config import ConfigError, PipelineSpec, ProjectSpec, describe_errors, home
from .kafka import EMBEDDED, KafkaSettings
from .store import StoreSettings


class _Resource(ConfigurableResource):
    # Dagster's resources ignore unknown keys: a misspelled setting would fall back to its
    # default (such as another user's port) without a word.
    model_config = ConfigDict(extra="forbid")


class SparkResource(_Resource):
    """The Spark that runs steps.  By default, the embedded Spark Connect server: one warm
    local JVM that every run, sensor and CLI process of the machine shares (started on
    ``embedded_port`` when none runs; its pid and log under ``$DBSP_HOME/spark``).
    ``remote: sc://host:15002`` names a Connect server of a cluster instead; ``master``
    (``local[N]``, ``spark://host:7077``, ``k8s://...``, ``yarn``) starts a classic Spark
    inside each run's process."""

    remote: str = Field(EMBEDDED, description="sc://host:port of a Spark Connect server, or 'embedded'")
    master: str | None = Field(None, description="a classic Spark master URL instead of Connect (in-process driver)")
    embedded_port: int = Field(15002, gt=0, lt=65536, description="port of the embedded Spark Connect server")
    embedded_master: str = Field("local[2]", description="the embedded server's Spark master")
    embedded_driver_memory: str = Field("4g", description="the embedded server's JVM heap")
    embedded_log_level: str = Field(
        "WARN", description="the embedded server's log level (Log4j: ERROR, WARN, INFO, DEBUG)"
    )
    conf: dict[str, str] = Field(default_factory=dict, description="extra Spark settings, e.g. spark.executor.memory")

    def session(self) -> SparkSession:
        if self.master is not None:
            return session(self.master, "dbsp", self.conf)
        if self.remote != EMBEDDED:
            return remote_session(self.remote, self.conf)
        # The embedded server takes the extra settings when it starts (a running one keeps its own).
        url = connect_server(
            home("spark"),
            self.embedded_port,
            self.embedded_master,
            self.embedded_driver_memory,
            self.conf,
            log_level=self.embedded_log_level,
        )
        return remote_session(url, setting="resources.spark.embedded_port")


class StoreResource(_Resource, StoreSettings):
    """Where each pipeline keeps its Delta tables (:class:`~dagster_project.store.StoreSettings`)."""


class KafkaResource(_Resource, KafkaSettings):
    """The Kafka cluster the offset sensors watch (:class:`~dagster_project.kafka.KafkaSettings`)."""

    def topics(self, spec: PipelineSpec) -> KafkaSource | None:
        """The pipeline's topics on this cluster (the embedded broker is started, and the
        topics created on it, when missing); None for a pipeline without topics."""
        if not spec.topics:
            return None
        bootstrap = self.bootstrap({t: spec.topic_partitions for t in spec.topics.values()})
        return KafkaSource(bootstrap, spec.topics, self.client_config())

    def source(self, spec: PipelineSpec, store: StoreResource, spark: SparkResource, verify: bool = False) -> Sources:
        """The pipeline's inputs: its topics (see :meth:`topics`), its Delta tables (one on S3
        reached with ``store``'s settings; one named in the catalog found with ``spark``, and
        with ``verify`` asked again: see :func:`~sensors.delta_source.catalog_tables`) and the
        views of other pipelines it reads (their output logs in ``store``)."""
        upstream = {view_name(s)[0] for s in spec.upstream.values()}
        tables = catalog_tables(spec.tables, store.pipeline_root(spec.name), spark.session, verify)
        for source in tables.values():
            store.reach(table_path(source))
        return Sources(
            self.topics(spec),
            DeltaTables(tables) if tables else None,
            UpstreamViews(spec.upstream, {p: store.pipeline_root(p) for p in upstream}) if spec.upstream else None,
        )


def build_resources(project: ProjectSpec) -> dict[str, ConfigurableResource]:
    """The resources from the project's ``resources`` settings; ``{env: NAME}`` becomes ``EnvVar(NAME)``."""
    resources = {}
    for key, cls in (("spark", SparkResource), ("store", StoreResource), ("kafka", KafkaResource)):
        settings = getattr(project.resources, key)
        try:
            resources[key] = cls(**{name: _value(v) for name, v in settings.items()})
        except ValidationError as e:
            raise ConfigError(f"{project.source}: {describe_errors(e, cls, ('resources', key))}") from None
    return resources


def _value(value):
    return EnvVar(value["env"]) if isinstance(value, dict) and set(value) == {"env"} else value
