"""``dbsp check``: the errors a configuration and its views would meet at a step, found
before any step is recorded.

Every pipeline is validated on its own (so one's error hides no other's), then, with a
Spark session of the configured kind: its schemas parsed by Spark and checked against the
types JSON input carries, its producer or circuit imported, and each view of its ``sql:``
file analysed by Spark over the declared schemas and compiled (one error per view that does
not).  Each error names where to fix it: ``file:line`` of the configuration (its YAML
node) or of the SQL file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import yaml
from pydantic import ValidationError
from pyspark.logger import PySparkLogger
from pyspark.sql import SparkSession

from circuits.errors import DbspError
from circuits.sql.compiler import compile_errors
from circuits.sql.parse import parse_errors
from sensors.decode import fields_of

from .config import (
    BUILT_IN,
    ConfigError,
    PipelineSpec,
    config_file,
    demo_settings,
    describe_error,
    load_object,
    parse_project,
)
from .resources import build_resources

Loc = tuple


class Located:
    """A configuration's text and YAML nodes, to say on which line a setting is."""

    def __init__(self, path: str | None, text: str | None) -> None:
        self.file = path or BUILT_IN
        self.root = yaml.compose(text) if text else None

    def at(self, loc: Loc, message: str) -> str:
        """``message`` about the setting at ``loc`` (keys and list indexes), as ``file:line: where: message``."""
        return self.described(loc, f"{'.'.join(str(part) for part in loc) or '(top level)'}: {message}")

    def described(self, loc: Loc, description: str) -> str:
        """A description that names its setting (``where: message``), with the file and line first."""
        line = self.line(loc)
        return f"{self.file}{f':{line}' if line else ''}: {description}"

    def line(self, loc: Loc) -> int | None:
        """The line of the deepest node of ``loc`` the file has (a mapping entry's key)."""
        node, line = self.root, None
        for part in loc:
            if isinstance(node, yaml.MappingNode):
                entry = next(((k, v) for k, v in node.value if k.value == str(part)), None)
                if entry is None:
                    break
                line, node = entry[0].start_mark.line + 1, entry[1]
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
                node = node.value[part]
                line = node.start_mark.line + 1
            else:
                break
        return line


def check_configuration(path: str | None) -> tuple[list[str], str]:
    """The errors of the configuration at ``path`` (see :func:`config_file`) and of its
    views, and a summary of what was checked."""
    # sqlglot warns on stderr of each statement it cannot parse; the statement's error is reported.
    logging.getLogger("sqlglot").setLevel(logging.ERROR)
    path, named = config_file(path)
    try:
        text = Path(path).read_text() if path else None
        data = yaml.safe_load(text) if text is not None else demo_settings()
    except OSError as e:
        return [f"{named}: cannot read the pipeline configuration: {e.strerror}"], ""
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        return [f"{path}{f':{mark.line + 1}' if mark else ''}: not YAML: {e}"], ""
    located = Located(path, text)
    if not isinstance(data, dict) or not isinstance(data.get("pipelines"), list):
        return [located.at(("pipelines",), "give a list of pipelines (see dbsp.example.yaml)")], ""
    base = os.path.dirname(os.path.abspath(path)) if path else "."
    specs, errors = {}, []
    for i, entry in enumerate(data["pipelines"]):
        try:
            specs[i] = PipelineSpec.model_validate(entry, context={"base": base, "circuits": False})
        except ValidationError as e:
            for error in map(partial(_placed, entry), e.errors()):
                where = ("pipelines", i, *error["loc"])
                statements = _statement_errors(entry, base) if error["loc"] == ("sql",) else []
                errors += statements or [
                    located.described(where, describe_error(error, PipelineSpec, ("pipelines", i)))
                ]
    try:
        resources = build_resources(
            parse_project({"pipelines": [], "resources": data.get("resources", {})}, located.file, base, circuits=False)
        )
        session = resources["spark"].session()
    except DbspError as e:
        return [*errors, located.at(("resources",), str(e))], ""
    # PySpark logs each analysis error with its plan on stderr; the error itself is reported.
    PySparkLogger.getLogger("SQLQueryContextLogger").disabled = True
    for i, spec in specs.items():
        errors += [
            located.at(("pipelines", i, *loc), m) if loc else m for loc, m in _pipeline_errors(spec, session, base)
        ]
    if not errors and specs:
        errors += _project_errors(data, located, base)
    views = sum(len(s.sql_views) for s in specs.values())
    return errors, f"{len(specs)} pipeline(s), {views} SQL view(s)"


def _placed(entry: object, error: dict) -> dict:
    """A pipeline's error; one of ``schemas`` at the handle it names (``handle: message``)."""
    schemas = entry.get("schemas") if isinstance(entry, dict) else None
    handle, _, rest = error["msg"].removeprefix("Value error, ").partition(": ")
    if tuple(error["loc"]) == ("schemas",) and isinstance(schemas, dict) and handle in schemas:
        return {**error, "loc": ("schemas", handle), "msg": rest}
    return error


def _statement_errors(entry: dict, base: str) -> list[str]:
    """Each statement's error in the pipeline's SQL file (loading it names the first only)."""
    path = Path(base, entry["sql"]).absolute()
    try:
        return [str(e) for e in parse_errors(path.read_text(), str(path))]
    except OSError:
        return []


def _project_errors(data: dict, located: Located, base: str) -> list[str]:
    """What holds between the pipelines (unique names, the gateway's topics)."""
    try:
        parse_project(data, located.file, base, circuits=False)
    except ConfigError as e:
        return [str(e)]
    return []


def _pipeline_errors(spec: PipelineSpec, session: SparkSession, base: str) -> Iterator[tuple[Loc, str]]:
    """A pipeline's errors: (where in its entry, message); an empty ``where`` when the
    message names its own place (a SQL file's line)."""
    for key in ("producer", "circuit"):  # imported as the configuration's load imports them
        try:
            if getattr(spec, key) is not None:
                load_object(getattr(spec, key), base)
        except ValueError as e:
            yield (key,), str(e)
            return
    if spec.circuit is not None:
        yield from _circuit_errors(spec, session)
        return
    try:
        schemas = spec.input_schemas()
    except ValueError as e:
        yield ("schemas",), str(e)
        return
    bad = dict(_schema_errors(spec, schemas))
    yield from (((("schemas", h) if h in spec.schemas else ("producer",)), m) for h, m in bad.items())
    if bad:
        return
    yield from (((), str(e)) for e in compile_errors(Path(spec.sql).read_text(), schemas, session, spec.sql))
    unknown = set(spec.sink_names) - {v.name for v in spec.sql_views if v.materialized}
    if unknown:
        yield ("sinks",), f"{sorted(unknown)} are not materialized views of {spec.sql}"


def _schema_errors(spec: PipelineSpec, schemas: dict) -> Iterator[tuple[str, str]]:
    """Per input handle, why its schema is not one a step can read."""
    for handle, ddl in schemas.items():
        try:
            fields_of(ddl)
        except DbspError as e:
            yield handle, str(e)
        except Exception as e:  # Spark's parser: not a schema at all
            yield handle, f"{ddl!r} is not a Spark DDL schema ({str(e).strip().splitlines()[0]})"


def _circuit_errors(spec: PipelineSpec, session: SparkSession) -> Iterator[tuple[Loc, str]]:
    try:
        circuit = spec.check(spec.build_circuit(session))
    except (ValueError, DbspError) as e:
        yield ("circuit",), str(e)
        return
    for handle, message in _schema_errors(spec, circuit.inputs):
        yield ("circuit",), f"input {handle!r}: {message}"
