"""The pipelines a code location serves, as pydantic models validated when definitions load.

A pipeline is a circuit (a ``module:function`` returning a :class:`circuits.Circuit`), a
Kafka topic per input handle, and settings.  They are read from the YAML file named by
``DBSP_CONFIG`` (default ``dbsp.yaml`` in the working directory); without one, the
embedded Nexmark demo pipeline is served.  Every error names the field and the fix.
"""

import importlib
import os
import re
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pyspark import SparkContext
from pyspark.sql.utils import is_remote

from circuits.circuit import Circuit
from circuits.errors import DbspError
from sensors.gateway.config import GatewaySpec, SourceSpec

CONFIG_ENV = "DBSP_CONFIG"
HOME_ENV = "DBSP_HOME"


class ConfigError(DbspError):
    """The project's configuration is invalid: the message names the setting and the fix."""


def home(*parts: str) -> str:
    """Where local state lives: ``$DBSP_HOME`` (default ``.dbsp`` in the working directory)."""
    return str(Path(os.environ.get(HOME_ENV) or ".dbsp").absolute().joinpath(*parts))


def load_object(path: str):
    module, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"cannot import {path!r} ({e}); write it as 'package.module:function'") from e


class SinkSpec(BaseModel):
    """A published circuit output; in the configuration a name, or ``{name: ..., current: false}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="an output of the circuit")
    current: bool = Field(
        True, description="keep the view's current contents as a Delta table at <store root>/<pipeline>/views/<sink> (true/false)"
    )


class PipelineSpec(BaseModel):
    """One incremental pipeline: circuit, sources and settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="identifier: lowercase letters, digits and '_', starting with a letter")
    circuit: str = Field(description="'package.module:function' returning the circuits.Circuit to maintain")
    sources: dict[str, str] = Field(
        description="the Kafka topic of each circuit input, e.g. {bids: nexmark.bids}; every input needs one"
    )
    sinks: list[SinkSpec] = Field(
        description="the circuit outputs to publish, one Dagster asset each: names, or {name: ..., current: false} "
        "to keep only the change log",
        min_length=1,
    )
    topic_partitions: int = Field(4, gt=0, description="partitions of the topics the embedded broker creates")
    workers: int = Field(2, gt=0, description="workers (Spark tasks) the state's vnodes are spread over")
    max_records_per_step: int = Field(10_000, gt=0, description="a step holds at most this many input records")
    max_wait_seconds: float = Field(
        30.0, ge=0, description="a step with fewer records is cut once the previous one is this old"
    )
    sensor_interval_seconds: int = Field(10, gt=0, description="how often the offset sensor looks at the topics")
    sensor_running: bool = Field(True, description="whether the offset sensor starts running by default")
    lease_wait_seconds: float = Field(
        600.0, ge=0, description="how long a run waits for another run of this pipeline to finish"
    )
    bags: list[str] = Field(
        default_factory=list, description="outputs that may hold duplicate rows (skipped by the is-a-set check)"
    )
    producer: str | None = Field(
        None, description="'module:function(start, count, seed)' returning records per input handle, for a demo producer job"
    )

    @field_validator("sinks", mode="before")
    @classmethod
    def _sink_names(cls, sinks: object) -> object:
        return [{"name": s} if isinstance(s, str) else s for s in sinks] if isinstance(sinks, list) else sinks

    @property
    def sink_names(self) -> list[str]:
        return [s.name for s in self.sinks]

    @property
    def views(self) -> list[str]:
        """The sinks whose current contents are kept as tables (all but ``current: false``)."""
        return [s.name for s in self.sinks if s.current]

    @field_validator("name")
    @classmethod
    def _identifier(cls, name: str) -> str:
        if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            raise ValueError(f"{name!r} is not an identifier: use lowercase letters, digits and '_', starting with a letter")
        return name

    @model_validator(mode="after")
    def _bags_are_sinks(self) -> "PipelineSpec":
        if set(self.bags) - set(self.sink_names):
            raise ValueError(f"bags: {sorted(set(self.bags) - set(self.sink_names))} are not sinks; the sinks are {self.sink_names}")
        return self

    @field_validator("circuit", "producer")
    @classmethod
    def _importable(cls, path: str | None) -> str | None:
        if path is not None:
            load_object(path)
        return path

    @model_validator(mode="after")
    def _matches_circuit(self) -> "PipelineSpec":
        # Building a circuit needs Spark columns: Spark Connect's are plain Python, a classic
        # session's need its JVM.  A code server has no JVM, so in classic mode the check
        # waits until a run builds the circuit.
        if is_remote() or SparkContext._active_spark_context is not None:
            self.check(self.build_circuit())
        return self

    def build_circuit(self) -> Circuit:
        circuit = load_object(self.circuit)()
        if not isinstance(circuit, Circuit):
            raise ValueError(f"circuit: {self.circuit} returned {type(circuit).__name__}, not a circuits.Circuit")
        return circuit

    def check(self, circuit: Circuit) -> Circuit:
        """``circuit`` if the sources and sinks match its inputs and outputs."""
        missing, unknown = set(circuit.inputs) - set(self.sources), set(self.sources) - set(circuit.inputs)
        if missing or unknown:
            raise ValueError(
                f"sources: the circuit's inputs are {sorted(circuit.inputs)}; "
                + (f"give a topic for {sorted(missing)}" if missing else f"{sorted(unknown)} are not inputs of the circuit")
            )
        unknown = set(self.sink_names) - set(circuit.outputs)
        if unknown:
            raise ValueError(f"sinks: {sorted(unknown)} are not outputs of the circuit; its outputs are {sorted(circuit.outputs)}")
        return circuit

    @cached_property
    def circuit_def(self) -> Circuit:
        """The circuit, built and checked against the sources and sinks (needs a running Spark)."""
        try:
            return self.check(self.build_circuit())
        except ValueError as e:
            raise ConfigError(f"pipeline {self.name!r}: {e}") from None


class ResourcesSpec(BaseModel):
    """Settings of the Dagster resources; a value ``{env: NAME}`` is read from the
    environment variable ``NAME`` when a run starts (for secrets)."""

    model_config = ConfigDict(extra="forbid")

    spark: dict[str, Any] = Field(default_factory=dict, description="SparkResource settings: master, conf")
    store: dict[str, Any] = Field(default_factory=dict, description="StoreResource settings: root")
    kafka: dict[str, Any] = Field(
        default_factory=dict,
        description="KafkaResource settings: bootstrap_servers, security_protocol, sasl_mechanism, sasl_username, sasl_password",
    )


class ProjectSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pipelines: list[PipelineSpec] = Field(description="the pipelines this code location serves")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="settings of Spark, the store and Kafka")
    sources: list[SourceSpec] = Field(
        default_factory=list, description="what the source gateway (dbsp gateway) reads into the pipelines' topics"
    )
    gateway: GatewaySpec = Field(default_factory=GatewaySpec, description="the source gateway's buffers, threads and endpoint")

    @model_validator(mode="after")
    def _unique(self) -> "ProjectSpec":
        names = [p.name for p in self.pipelines]
        if len(set(names)) != len(names):
            raise ValueError(f"pipelines: names must be unique, got {names}")
        return self

    @model_validator(mode="after")
    def _sources_feed_pipelines(self) -> "ProjectSpec":
        topics = {t for p in self.pipelines for t in p.sources.values()}
        for i, group in enumerate(self.sources):
            if group.topic not in topics:
                raise ValueError(f"sources.{i}.topic: {group.topic!r} is no pipeline's input topic; use one of {sorted(topics)}")
        names = [g.name for g in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"sources: group names must be unique, got {names}")
        return self

    def topic_partitions(self, topic: str) -> int:
        """The partitions the embedded broker gives ``topic`` (its pipeline's setting)."""
        return next(p.topic_partitions for p in self.pipelines if topic in p.sources.values())


DEMO = {
    "pipelines": [
        {
            "name": "nexmark",
            "circuit": "circuits.library.nexmark_queries:nexmark_circuit",
            "sources": {"persons": "nexmark.persons", "auctions": "nexmark.auctions", "bids": "nexmark.bids"},
            "sinks": ["bids_by_category", "q3", "q4", "q15"],
            "max_records_per_step": 5_000,
            "max_wait_seconds": 5,
            "producer": "circuits.library.nexmark:nexmark_records",
        }
    ]
}


def load_project(path: str | None = None) -> ProjectSpec:
    """The project's pipelines from ``path`` (default: ``$DBSP_CONFIG``, then ``./dbsp.yaml``,
    then the built-in Nexmark demo)."""
    path = path or os.environ.get(CONFIG_ENV) or ("dbsp.yaml" if os.path.exists("dbsp.yaml") else None)
    if path is None:
        return parse_project(DEMO, "the built-in demo configuration")
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{CONFIG_ENV}={path}: cannot read the pipeline configuration: {e}") from e
    return parse_project(data, path)


def parse_project(data: object, source: str) -> ProjectSpec:
    try:
        return ProjectSpec.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(_describe(error) for error in e.errors())
        raise ConfigError(f"{source}: {problems}") from None


def _describe(error: dict) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "(top level)"
    message = error["msg"].removeprefix("Value error, ")
    fields = SinkSpec.model_fields | PipelineSpec.model_fields if "sinks" in error["loc"] else PipelineSpec.model_fields
    field = fields.get(str(error["loc"][-1])) if error["loc"] else None
    hint = f" (expected: {field.description})" if field is not None and field.description else ""
    return f"{where}: {message}{hint}"
