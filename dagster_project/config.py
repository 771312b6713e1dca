"""The pipelines a code location serves, as pydantic models validated when definitions load.

A pipeline is a circuit (a ``module:function`` returning a :class:`circuits.Circuit`, or a
file of SQL views compiled into one), a Kafka topic per input handle, and settings.  They are read from the YAML file named by
``DBSP_CONFIG`` (default ``dbsp.yaml`` in the working directory); without one, the
embedded Nexmark demo pipeline is served.  Every error names the field and the fix.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from circuits.errors import DbspError
from circuits.sql import SqlError, View, parse_views
from circuits.sql.parse import check_columns, ddl_columns, ddl_fields, read_tables, views_read
from gateway.config import GatewaySpec, SourceSpec
from storage.location import S3_SCHEMES, s3_uri

if typing.TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql import types as T

    from circuits.circuit import Circuit

CONFIG_ENV = "DBSP_CONFIG"
DELTA = "delta:"  # as sensors.delta_source.DELTA: this module loads no source package
TABLE = "table:"  # as sensors.delta_source.TABLE
VIEW = "view:"  # as sensors.upstream.VIEW


def upstream_view(source: str) -> tuple[str, str]:
    """``(pipeline, sink)`` of a ``view:<pipeline>.<sink>`` source (as sensors.upstream.view_name)."""
    pipeline, _, sink = source.removeprefix(VIEW).partition(".")
    return pipeline, sink


HOME_ENV = "DBSP_HOME"
POSTGRES_ENV = "DBSP_DAGSTER_POSTGRES_URL"  # a new Dagster home's storage: this PostgreSQL database


class ConfigError(DbspError):
    """The project's configuration is invalid: the message names the setting and the fix."""


def home(*parts: str) -> str:
    """Where local state lives: ``$DBSP_HOME`` (default ``.dbsp`` in the working directory)."""
    return str(Path(os.environ.get(HOME_ENV) or ".dbsp").absolute().joinpath(*parts))


def load_object(path: str, base: str | None = None):
    """The object ``path`` (``module:name``) names; a module not found on ``sys.path`` is
    looked for in ``base`` (the configuration file's directory) too."""
    module, _, name = path.partition(":")
    try:
        with _on_path(base):
            return getattr(importlib.import_module(module), name)
    except Exception as e:  # a module failing as it imports is the configuration's fault too
        raise ValueError(
            f"cannot import {path!r} ({type(e).__name__}: {e}); write it as 'package.module:function', "
            "the module importable or beside the configuration file"
        ) from e


@contextlib.contextmanager
def _on_path(directory: str | None) -> Iterator[None]:
    """``directory`` at the end of ``sys.path`` for the block, so an installed module of the
    same name wins."""
    added = directory is not None and directory not in sys.path
    if added:
        sys.path.append(directory)
    try:
        yield
    finally:
        if added:
            sys.path.remove(directory)


class SinkSpec(BaseModel):
    """A published circuit output; in the configuration a name, or ``{name: ..., current: false}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="an output of the circuit")
    current: bool = Field(
        True,
        description="keep the view's current contents as a Delta table at <store root>/<pipeline>/views/<sink> (true/false)",
    )


class PipelineSpec(BaseModel):
    """One incremental pipeline: circuit, sources and settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    _circuit: Circuit | None = PrivateAttr(None)

    name: str = Field(description="identifier: lowercase letters, digits and '_', starting with a letter")
    circuit: str | None = Field(
        None, description="'package.module:function' returning the circuits.Circuit to maintain (or sql:, not both)"
    )
    sql: str | None = Field(
        None,
        description="a file of CREATE MATERIALIZED VIEW / CREATE TEMPORARY VIEW name AS SELECT ... statements over "
        "the sources' handles, relative to the configuration file (or circuit:, not both)",
    )
    schemas: dict[str, str] = Field(
        default_factory=dict,
        description="for sql:, the Spark DDL schema of a source handle, e.g. {persons: 'id BIGINT, name STRING'}; "
        "without it, the producer module's SCHEMAS",
    )
    sources: dict[str, str] = Field(
        description="the source of each circuit input, every input needs one: a Kafka topic (bids: nexmark.bids), a "
        "Delta table with the change data feed on, 'delta:' and its path (orders: delta:/data/orders; relative to "
        "the configuration file) or 'table:' and its name in the Spark catalog (orders: table:shop.orders), or a view of another pipeline of this file (totals: view:shop.by_region)"
    )
    sinks: list[SinkSpec] = Field(
        default_factory=list,
        description="the circuit outputs to publish, one Dagster asset each: names, or {name: ..., current: false} "
        "to keep only the change log; for sql:, every materialized view by default",
    )
    topic_partitions: int = Field(4, gt=0, description="partitions of the topics the embedded broker creates")
    workers: int = Field(2, gt=0, description="workers (Spark tasks) the state's vnodes are spread over")
    max_records_per_step: int = Field(10_000, gt=0, description="a step holds at most this many input records")
    max_wait_seconds: float = Field(
        30.0, ge=0, description="a step with fewer records is cut once the previous one is this old"
    )
    sensor_interval_seconds: int = Field(10, gt=0, description="how often the offset sensor looks at the topics")
    sensor_running: bool = Field(True, description="whether the offset sensor starts running by default")
    retry_backoff_seconds: float = Field(
        10.0, ge=0, description="how long the sensor waits to request a failed step's run again; doubled per failure"
    )
    retry_backoff_max_seconds: float = Field(
        600.0, ge=0, description="the longest wait before a failed step's run is requested again"
    )
    lease_wait_seconds: float = Field(
        600.0, ge=0, description="how long a run waits for another run of this pipeline to finish"
    )
    max_dead_letter_share: float = Field(
        0.5,
        ge=0,
        le=1,
        description="a step run fails its views' asset checks when an input's records were all dead letters, or "
        "more than this share of them (0: any dead letter; 1: only all)",
    )
    bags: list[str] = Field(
        default_factory=list, description="outputs that may hold duplicate rows (skipped by the is-a-set check)"
    )
    producer: str | None = Field(
        None,
        description="'module:function(start, count, seed)' returning records per input handle, for a demo producer job",
    )

    @field_validator("sources")
    @classmethod
    def _table_paths(cls, sources: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        """Each Delta table's path made absolute, so that its divisions name one table."""
        resolved = {}
        for handle, source in sources.items():
            if source.startswith(DELTA):
                path = source.removeprefix(DELTA).removeprefix("file://")
                if not path:
                    raise ValueError(f"{handle}: {source!r} names no table; write delta:/path/to/table")
                scheme = path.split("://", 1)[0] if "://" in path else ""
                if scheme in S3_SCHEMES:
                    source = DELTA + s3_uri(path)  # reached with resources.store's settings
                elif scheme:
                    raise ValueError(
                        f"{handle}: {source!r}: a Delta table is read from a local (or mounted) path or from "
                        f"s3://bucket/path, not {scheme}://; mount that store and give the mount path"
                    )
                else:
                    source = DELTA + str(Path((info.context or {}).get("base", ".")).joinpath(path).absolute())
            elif source.startswith(TABLE):
                if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*){0,2}", source.removeprefix(TABLE)):
                    raise ValueError(
                        f"{handle}: {source!r} names no table; write table:<schema>.<name> (or "
                        "table:<catalog>.<schema>.<name>), a Delta table of the Spark session's catalog"
                    )
            elif source.startswith(VIEW):
                if not re.fullmatch(r"[a-z][a-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*", source.removeprefix(VIEW)):
                    raise ValueError(
                        f"{handle}: {source!r} names no view; write view:<pipeline>.<view>, a pipeline of this file "
                        "and one of its sinks"
                    )
            elif not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", source):
                raise ValueError(
                    f"{handle}: {source!r} is neither a Kafka topic (letters, digits, '.', '_' and '-'), a Delta "
                    "table (delta:/path/to/table, or table:<schema>.<name> in the Spark catalog) nor another "
                    "pipeline's view (view:<pipeline>.<view>)"
                )
            resolved[handle] = source
        return resolved

    @property
    def topics(self) -> dict[str, str]:
        """The Kafka topic of each input read from Kafka."""
        return {h: s for h, s in self.sources.items() if not s.startswith((DELTA, TABLE, VIEW))}

    @property
    def tables(self) -> dict[str, str]:
        """The source (``delta:<path>`` or ``table:<name>``) of each input read from a Delta table."""
        return {h: s for h, s in self.sources.items() if s.startswith((DELTA, TABLE))}

    @property
    def upstream(self) -> dict[str, str]:
        """The source (``view:<pipeline>.<sink>``) of each input read from another pipeline's view."""
        return {h: s for h, s in self.sources.items() if s.startswith(VIEW)}

    @property
    def sensor_name(self) -> str:
        """The Dagster sensor that cuts the pipeline's steps, named for what it watches: its
        topics' end offsets, or, when no input is a topic, the versions of Delta logs (its
        tables', its upstream pipelines' output logs)."""
        return f"{self.name}_kafka_offsets" if self.topics else f"{self.name}_delta_versions"

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
            raise ValueError(
                f"{name!r} is not an identifier: use lowercase letters, digits and '_', starting with a letter"
            )
        return name

    @field_validator("circuit", "producer")
    @classmethod
    def _importable(cls, path: str | None, info: ValidationInfo) -> str | None:
        if path is not None and _checks_circuits(info):
            load_object(path, (info.context or {}).get("base"))
        return path

    @field_validator("sql")
    @classmethod
    def _sql_file(cls, path: str | None, info: ValidationInfo) -> str | None:
        """The file's absolute path, once its views parse (syntax, constructs, names, cycles)."""
        if path is None:
            return None
        located = Path((info.context or {}).get("base", ".")).joinpath(path).absolute()
        try:
            parse_views(located.read_text(), str(located))
        except OSError as e:
            raise ValueError(
                f"cannot read {located} ({e.strerror}); the path is relative to the configuration file"
            ) from None
        except SqlError as e:
            raise ValueError(str(e)) from None
        return str(located)

    @field_validator("schemas")
    @classmethod
    def _ddl(cls, schemas: dict[str, str]) -> dict[str, str]:
        from circuits.zset import parse_schema  # Spark's types: only a pipeline with schemas needs them

        for handle, ddl in schemas.items():
            try:
                parse_schema(ddl)
            except Exception as e:
                fields = [c.strip() for c in ddl_fields(ddl)]
                untyped = [c for c in fields if len(c.split()) < 2 and not set(c) & set(":<>")]
                joined = [c for c in fields if _two_columns(c)]
                if not untyped and not joined and not _spark_there():
                    continue  # a nested type, for Spark's parser when the run opens its session
                reason = (
                    f"{untyped[0]!r} has no type"
                    if untyped
                    else f"{joined[0]!r} is two columns: a comma is missing"
                    if joined
                    else str(e).strip().splitlines()[0]
                )
                raise ValueError(
                    f"{handle}: {ddl!r} is not a Spark DDL schema ({reason}); write it as 'id BIGINT, name STRING'"
                ) from None
        return schemas

    @model_validator(mode="after")
    def _one_definition(self) -> PipelineSpec:
        if (self.circuit is None) == (self.sql is None):
            raise ValueError("circuit, sql: give exactly one: circuit: 'package.module:function', or sql: views.sql")
        if self.sql is not None:
            self._check_sql_tables()
            if not self.sinks:  # frozen: the default is set once, here
                object.__setattr__(self, "sinks", [SinkSpec(name=v.name) for v in self.sql_views if v.materialized])
        if not self.sinks:
            raise ValueError("sinks: name at least one output of the circuit to publish")
        return self

    @model_validator(mode="after")
    def _bags_are_sinks(self) -> PipelineSpec:
        if set(self.bags) - set(self.sink_names):
            raise ValueError(
                f"bags: {sorted(set(self.bags) - set(self.sink_names))} are not sinks; the sinks are {self.sink_names}"
            )
        return self

    def _check_sql_tables(self) -> None:
        names = {v.name.lower() for v in self.sql_views}
        for view in self.sql_views:
            unknown = sorted(read_tables(view.query) - names - {h.lower() for h in self.sources})
            if unknown:
                raise ValueError(
                    str(
                        view.error(
                            f"reads {unknown}, neither a source nor a view of the file; the sources are {sorted(self.sources)}"
                        )
                    )
                )

    @cached_property
    def sql_views(self) -> list[View]:
        """The views of ``sql:``, each after the views it reads (empty for ``circuit:``)."""
        return parse_views(Path(self.sql).read_text(), self.sql) if self.sql else []

    def view_sql(self, name: str) -> str | None:
        """The SQL text of view ``name``, for a ``sql:`` pipeline."""
        return next((v.text for v in self.sql_views if v.name == name), None)

    def view_reads(self, name: str) -> list[str]:
        """The materialized views that view ``name`` reads, directly or through temporary views."""
        view = next((v for v in self.sql_views if v.name == name), None)
        read = views_read(view, self.sql_views, through_materialized=False) if view else set()
        return [v.name for v in self.sql_views if v.name.lower() in read]

    def view_sources(self, name: str) -> list[str]:
        """The source handles whose records view ``name`` is computed from (for ``circuit:``,
        every source: which inputs an output reads is the circuit's own)."""
        view = next((v for v in self.sql_views if v.name == name), None)
        if view is None:
            return sorted(self.sources)
        read = read_tables(view.query).union(
            *(read_tables(v.query) for v in self.sql_views if v.name.lower() in views_read(view, self.sql_views))
        )
        return sorted(h for h in self.sources if h.lower() in read)

    def input_schemas(self) -> dict[str, str]:
        """Each source's DDL: ``schemas:``, else the producer module's ``SCHEMAS``."""
        produced = (
            getattr(importlib.import_module(self.producer.partition(":")[0]), "SCHEMAS", {}) if self.producer else {}
        )
        schemas = {h: self.schemas.get(h) or produced.get(h) for h in self.sources}
        missing = sorted(h for h, ddl in schemas.items() if ddl is None)
        if missing:
            raise ValueError(
                f"schemas: give the Spark DDL schema of {missing}, e.g. {{{missing[0]}: 'id BIGINT, name STRING'}}"
            )
        return schemas

    @model_validator(mode="after")
    def _matches_circuit(self, info: ValidationInfo) -> PipelineSpec:
        if not _checks_circuits(info):
            return self  # a reader of the topics alone (dbsp gateway): no circuit built, no Spark loaded
        circuit = _built(self.build_circuit) if self.circuit else self._compiled_if_session()
        if circuit is not None:
            self.check(circuit)
        elif self.sql:  # a circuit: that needs a session to be built declares its own input types
            self._check_input_types(self.input_schemas())
        if self.sql:  # compiled in the session the run uses (or None): the run compiles it no second time
            self._circuit = circuit
        return self

    def _compiled_if_session(self) -> Circuit | None:
        """The SQL compiled now if a Spark session is there (names and types checked); else its
        column names checked without Spark, and the SQL compiled at the run."""
        schemas = self.input_schemas()
        session = _active_session()
        if session is None:
            try:
                check_columns(self.sql_views, {h: ddl_columns(ddl) for h, ddl in schemas.items()})
            except SqlError as e:
                raise ValueError(f"sql: {e}") from None
            return None
        return self._compile(session, schemas)

    def _compile(self, session: SparkSession, schemas: dict[str, str]) -> Circuit:
        from circuits.sql import compile_sql
        from circuits.sql.analyses import Analyses, answering

        # Each run under `dagster dev` is a new process: Spark's answers from an earlier
        # compile save the run its round trips (see circuits.sql.analyses).
        analyses = Analyses(home("sql", f"{self.name}.analyses.json"), answering(session))
        try:
            return compile_sql(
                Path(self.sql).read_text(), schemas, session, name=self.name, file=self.sql, analyses=analyses
            )
        except SqlError as e:
            raise ValueError(f"sql: {e}") from None

    def build_circuit(self, session: SparkSession | None = None) -> Circuit:
        if self.sql is not None:
            if session is None:
                raise ValueError(f"sql: compiling {self.sql} needs a Spark session; open one before the pipeline")
            return self._compile(session, self.input_schemas())
        from circuits.circuit import Circuit

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
                + (
                    f"give a topic for {sorted(missing)}"
                    if missing
                    else f"{sorted(unknown)} are not inputs of the circuit"
                )
            )
        unknown = set(self.sink_names) - set(circuit.outputs)
        if unknown:
            raise ValueError(
                f"sinks: {sorted(unknown)} are not outputs of the circuit; its outputs are {sorted(circuit.outputs)}"
            )
        self._check_input_types(circuit.inputs)
        return circuit

    def _check_input_types(self, schemas: Mapping[str, T.StructType | str]) -> None:
        """Refuses an input column of a type JSON input cannot carry (a DDL schema with text
        that only Spark parses is checked once the circuit is compiled)."""
        from circuits.ddl import parse_ddl
        from sensors.decode import fields_of
        from sensors.errors import UnsupportedSchemaError

        for handle, schema in schemas.items():
            try:
                if not isinstance(schema, str) or parse_ddl(schema) is not None:
                    fields_of(schema)
            except UnsupportedSchemaError as e:
                raise ValueError(f"{'schemas' if self.sql else 'circuit'}: input {handle!r}: {e}") from None

    def circuit_for(self, session: SparkSession | None) -> Circuit:
        """The circuit, built once and checked against the sources and sinks; a ``sql:``
        file compiles in ``session``."""
        if self._circuit is None:
            try:
                self._circuit = self.check(self.build_circuit(session))
            except ValueError as e:
                raise ConfigError(f"pipeline {self.name!r}: {e}") from None
        return self._circuit

    @property
    def circuit_def(self) -> Circuit:
        """The circuit (needs a running Spark: a ``sql:`` file compiles in this thread's active session)."""
        return self.circuit_for(_active_session())


def _two_columns(field: str) -> bool:
    """Whether a DDL field runs two columns together (``id BIGINT name STRING``): a word after
    a type without parentheses that is neither ``NOT NULL`` nor ``COMMENT``."""
    words = field.replace(":", " ").split()
    return len(words) > 2 and not set(words[1]) & set("(<") and words[2].upper() not in ("NOT", "COMMENT")


def _checks_circuits(info: ValidationInfo) -> bool:
    """Whether to import and build the circuits (not for a reader of the topics alone)."""
    return (info.context or {}).get("circuits", True)


def _built(build: Callable[[], Circuit]) -> Circuit | None:
    """What ``build`` returns.  Building a circuit needs Spark columns: Spark Connect's are
    plain Python expressions, a classic session's need its JVM.  Without either (a code
    server, a CLI process before its session), Connect's stand in, so that a wrong source or
    sink fails the load; a circuit that needs a session to be built is left to the run's
    check (None)."""
    if _spark_there():
        return build()
    os.environ[_CONNECT_MODE] = "1"
    try:
        return build()
    except ValueError:  # the configuration's fault (not a circuit, not importable)
        raise
    except Exception:
        return None
    finally:
        os.environ.pop(_CONNECT_MODE, None)


_CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"  # what pyspark's is_remote() reads


def _spark_there() -> bool:
    """Whether Spark columns can be built here: Connect's, or a classic session's JVM."""
    from pyspark import SparkContext
    from pyspark.sql.utils import is_remote

    return is_remote() or SparkContext._active_spark_context is not None


def _active_session() -> SparkSession | None:
    """This thread's active Spark session; none unless PySpark is loaded (so asking loads no Spark)."""
    return sys.modules["pyspark.sql"].SparkSession.getActiveSession() if "pyspark.sql" in sys.modules else None


def env_values(section: str, settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` of ``resources.<section>`` with each ``{env: NAME}`` read from the environment
    now (a process without Dagster's ``EnvVar``)."""
    values = {}
    for name, value in settings.items():
        if isinstance(value, dict) and set(value) == {"env"}:
            if value["env"] not in os.environ:
                raise ConfigError(
                    f"resources.{section}.{name}: the environment variable {value['env']} is not set; set it"
                )
            value = os.environ[value["env"]]
        values[name] = value
    return values


M = TypeVar("M", bound=BaseModel)


def resource_settings(project: ProjectSpec, section: str, model: type[M]) -> M:
    """The project's ``resources.<section>`` as ``model`` (the settings without Dagster, for a
    process that loads none: the gateway's), a value ``{env: NAME}`` read from the environment now."""
    try:
        return model(**env_values(section, getattr(project.resources, section)))
    except ValidationError as e:
        raise ConfigError(f"{project.source}: {describe_errors(e, model, ('resources', section))}") from None


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
    _source: str = PrivateAttr("the configuration")

    pipelines: list[PipelineSpec] = Field(description="the pipelines this code location serves")
    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec, description="settings of Spark, the store and Kafka"
    )
    sources: list[SourceSpec] = Field(
        default_factory=list, description="what the source gateway (dbsp gateway) reads into the pipelines' topics"
    )
    gateway: GatewaySpec = Field(
        default_factory=GatewaySpec, description="the source gateway's buffers, threads and endpoint"
    )

    @model_validator(mode="after")
    def _unique(self) -> ProjectSpec:
        names = [p.name for p in self.pipelines]
        if len(set(names)) != len(names):
            raise ValueError(f"pipelines: names must be unique, got {names}")
        return self

    @model_validator(mode="after")
    def _sources_feed_pipelines(self) -> ProjectSpec:
        topics = {t for p in self.pipelines for t in p.topics.values()}
        for i, group in enumerate(self.sources):
            if group.topic not in topics:
                raise ValueError(
                    f"sources.{i}.topic: {group.topic!r} is no pipeline's input topic; use one of {sorted(topics)}"
                )
        names = [g.name for g in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"sources: group names must be unique, got {names}")
        return self

    @model_validator(mode="after")
    def _upstream_views(self) -> ProjectSpec:
        """Each ``view:<pipeline>.<sink>`` names a sink of another pipeline of the file, and
        no pipeline reads its own views through others."""
        by_name = {p.name: p for p in self.pipelines}
        for i, p in enumerate(self.pipelines):
            for handle, source in p.upstream.items():
                upstream, sink = upstream_view(source)
                where = f"pipelines.{i}.sources.{handle}: {source!r}"
                if upstream == p.name or upstream not in by_name:
                    others = sorted(set(by_name) - {p.name})
                    raise ValueError(f"{where}: {upstream!r} is no other pipeline of this file; use one of {others}")
                if sink not in by_name[upstream].sink_names:
                    raise ValueError(
                        f"{where}: {sink!r} is no sink of pipeline {upstream!r}; its sinks are {by_name[upstream].sink_names}"
                    )
        for p in self.pipelines:
            # Each pipeline reached from p, with the chain of reads that reaches it.
            chains, todo = {p.name: []}, [p.name]
            while todo:
                reader = todo.pop()
                for source in by_name[reader].upstream.values():
                    upstream, chain = upstream_view(source)[0], [*chains[reader], f"{reader} reads {source}"]
                    if upstream == p.name:
                        raise ValueError(
                            f"pipelines: {p.name!r} reads its own views ({', '.join(chain)}); remove the cycle"
                        )
                    if upstream not in chains:
                        chains[upstream] = chain
                        todo.append(upstream)
        return self

    @property
    def source(self) -> str:
        """Where the settings were read from (the file), for errors found after parsing."""
        return self._source

    def topic_partitions(self, topic: str) -> int:
        """The partitions the embedded broker gives ``topic`` (its pipeline's setting)."""
        return next(p.topic_partitions for p in self.pipelines if topic in p.topics.values())


def demo_settings() -> dict:
    """The built-in Nexmark demo's settings (its example library loads Spark: only when used)."""
    from circuits.library.nexmark_queries import NEXMARK_SQL

    return {
        "pipelines": [
            {
                "name": "nexmark",
                "sql": str(NEXMARK_SQL),
                "sources": {"persons": "nexmark.persons", "auctions": "nexmark.auctions", "bids": "nexmark.bids"},
                "max_records_per_step": 5_000,
                "max_wait_seconds": 5,
                "producer": NEXMARK_PRODUCER,
            }
        ]
    }


NEXMARK_PRODUCER = "circuits.library.nexmark:nexmark_records"


def load_project(path: str | None = None, circuits: bool = True) -> ProjectSpec:
    """The project's pipelines from ``path`` (default: ``$DBSP_CONFIG``, then ``./dbsp.yaml``,
    then the built-in Nexmark demo).  ``circuits=False`` checks no pipeline's circuit
    against its sources and sinks, for a reader of the topics alone (``dbsp gateway``)."""
    path, named = config_file(path)
    if path is None:
        return parse_project(demo_settings(), BUILT_IN, circuits=circuits)
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{named}: cannot read the pipeline configuration: {e}") from e
    return parse_project(data, path, base=os.path.dirname(os.path.abspath(path)), circuits=circuits)


BUILT_IN = "the built-in demo configuration"


def config_file(path: str | None = None) -> tuple[str | None, str]:
    """The configuration file :func:`load_project` reads (None: the built-in demo's), and how
    the user named it."""
    named = path or (f"{CONFIG_ENV}={os.environ[CONFIG_ENV]}" if os.environ.get(CONFIG_ENV) else None)
    path = path or os.environ.get(CONFIG_ENV) or ("dbsp.yaml" if os.path.exists("dbsp.yaml") else None)
    return path, named or path or BUILT_IN


def parse_project(data: object, source: str, base: str = ".", circuits: bool = True) -> ProjectSpec:
    """The project of ``data``; paths in it (``sql:``) are relative to ``base``."""
    try:
        project = ProjectSpec.model_validate(data, context={"base": base, "circuits": circuits})
    except ValidationError as e:
        raise ConfigError(f"{source}: {describe_errors(e, ProjectSpec)}") from None
    project._source = source
    return project


def describe_errors(error: ValidationError, model: type[BaseModel], prefix: tuple = ()) -> str:
    """Each problem of ``error`` (raised validating ``model``, found under ``prefix`` of the
    configuration) as ``where: what (expected: the field's description)``; an unknown key
    gets the nearest valid one."""
    return "; ".join(describe_error(e, model, prefix) for e in error.errors())


def describe_error(error: dict, model: type[BaseModel], prefix: tuple = ()) -> str:
    """One problem of :func:`describe_errors`."""
    loc = tuple(error["loc"])
    where = ".".join(str(part) for part in prefix + loc) or "(top level)"
    message = error["msg"].removeprefix("Value error, ")
    parent = _model_at(model, loc[:-1])
    if error["type"] == "extra_forbidden" and parent is not None:
        return f"{where}: {message}; {_nearest(str(loc[-1]), list(parent.model_fields))}"
    field = parent.model_fields.get(str(loc[-1])) if parent is not None and loc else None
    hint = f" (expected: {field.description})" if field is not None and field.description else ""
    return f"{where}: {message}{hint}"


def _nearest(key: str, names: list[str]) -> str:
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else f"the settings here are {', '.join(names)}"


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The model that holds the value at ``loc`` (field names, list indexes, dict keys and
    the tags of discriminated unions, as pydantic reports them), or None."""
    current: Any = model
    for part in loc:
        current = _inner(current, part)
        if current is None:
            return None
    current = _unwrapped(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _inner(annotation: Any, part: Any) -> Any:
    annotation = _unwrapped(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        field = annotation.model_fields.get(str(part))
        return field.annotation if field is not None else None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, tuple, set, frozenset) and isinstance(part, int):
        return args[0] if args else None
    if origin is dict:
        return args[1] if args else None
    if origin in (typing.Union, types.UnionType):
        return next((member for member in args if part in _tags(member)), None)
    return None


def _unwrapped(annotation: Any) -> Any:
    """``X`` of ``Annotated[X, ...]`` and of ``X | None``."""
    while True:
        if typing.get_origin(annotation) is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
            continue
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(members) == 1:
            annotation = members[0]
            continue
        return annotation


def _tags(member: Any) -> set:
    """The literal values a union member's fields pin (its discriminator's tag)."""
    if not (isinstance(member, type) and issubclass(member, BaseModel)):
        return set()
    return {
        v
        for f in member.model_fields.values()
        if typing.get_origin(f.annotation) is Literal
        for v in typing.get_args(f.annotation)
    }
