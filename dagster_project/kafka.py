"""The Kafka cluster's settings (``resources.kafka``) with no Dagster: the source gateway's
process reads them here, the Dagster resource (:class:`~dagster_project.resources.KafkaResource`)
adds itself on top."""

from pydantic import BaseModel, ConfigDict, Field

from sensors.broker import ensure_local_broker, ensure_topics

from .config import ProjectSpec, home, resource_settings

EMBEDDED = "embedded"


class KafkaSettings(BaseModel):
    """The Kafka cluster.  ``embedded`` (the default) starts a local Apache Kafka node on
    ``embedded_port`` (its controller on the port after) if nothing listens there, its log
    under ``$DBSP_HOME/broker``: for local runs, not production."""

    model_config = ConfigDict(extra="forbid")

    bootstrap_servers: str = Field(EMBEDDED, description="host:port,... of the Kafka cluster, or 'embedded'")
    embedded_port: int = Field(
        19092, gt=0, lt=65536, description="port of the embedded broker (its controller takes the next port)"
    )
    security_protocol: str | None = Field(None, description="e.g. SASL_SSL")
    sasl_mechanism: str | None = Field(None, description="e.g. PLAIN or SCRAM-SHA-512")
    sasl_username: str | None = Field(None, description="use EnvVar('KAFKA_USERNAME')")
    sasl_password: str | None = Field(None, description="use EnvVar('KAFKA_PASSWORD')")
    config: dict[str, str] = Field(
        default_factory=dict, description="further librdkafka settings of every client, e.g. {compression.type: lz4}"
    )

    def client_config(self) -> dict:
        settings = {
            "security.protocol": self.security_protocol,
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_username,
            "sasl.password": self.sasl_password,
        }
        return {**{k: v for k, v in settings.items() if v is not None}, **self.config}

    def bootstrap(self, topics: dict[str, int]) -> str:
        """The bootstrap servers, after starting the embedded broker and creating ``topics``
        (name: partitions) on it when missing; a configured cluster is used as it is."""
        if self.bootstrap_servers != EMBEDDED:
            return self.bootstrap_servers
        bootstrap = ensure_local_broker(self.embedded_port, home("broker"))
        ensure_topics(bootstrap, topics)
        return bootstrap


def kafka_settings(project: ProjectSpec) -> KafkaSettings:
    """The project's ``resources.kafka`` (see :func:`~dagster_project.config.resource_settings`)."""
    return resource_settings(project, "kafka", KafkaSettings)
