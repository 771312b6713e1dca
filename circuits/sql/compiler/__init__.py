"""SQL views compiled into one circuit.

Each query becomes a DAG of the engine's incremental operators; every scalar expression
stays Spark SQL text (evaluated by Spark, with Spark's semantics), its column names
rewritten to the compiler's own.  Every relation's columns get fresh names (``c0``,
``c1``, ...), so that self-joins, joins of same-named columns and correlated subqueries
never clash; a scope maps what the SQL calls a column (qualifier and name) to them.
Spark analyses each view's text over empty tables of the inputs' schemas: a name or type
error is reported before anything runs, and the view's output takes Spark's column names
and types.

The compiler is one class, :class:`~.core._Compiler`, made of a mixin per part of a query
(:mod:`.joins`, :mod:`.subqueries`, :mod:`.grouped`, :mod:`.ordering`); the relations
and scopes they pass each other are :mod:`.scope`'s, and window functions :mod:`.windowed`'s.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from ...circuit import Circuit
from ...zset import parse_schema
from ..analyses import Analyses
from ..errors import SqlError
from ..parse import parse_views, read_tables
from .core import _Compiler

__all__ = ["compile_errors", "compile_sql"]


def compile_sql(
    text: str,
    schemas: Mapping[str, T.StructType | str],
    spark: SparkSession,
    *,
    name: str = "sql",
    file: str = "<sql>",
    analyses: Analyses | None = None,
) -> Circuit:
    """The circuit of a file of views (see :mod:`circuits.sql.parse`): one input per table
    the views read (``schemas``: table name -> schema), one output per materialized view.
    Raises :class:`SqlError` naming the file, line and view of anything that does not load.
    Spark's analysis leaves the tables it read (empty, with their schemas) as temporary
    views of the ``spark`` session: compile in the session that runs the steps, not one
    whose temporary views of those names hold data.  ``analyses``: Spark's answers kept
    from an earlier compile (see :mod:`circuits.sql.analyses`), saved with the new ones."""
    views = parse_views(text, file)
    schemas = {k.lower(): parse_schema(v) for k, v in schemas.items()}
    compiler = _Compiler(Circuit(name), schemas, spark, analyses or Analyses())
    for view in views:
        compiler.view(view)
    compiler.analyses.save()
    compiler.circuit.declaring = None
    if not compiler.circuit.outputs:
        raise _no_output(file)
    return compiler.circuit


def compile_errors(
    text: str, schemas: Mapping[str, T.StructType | str], spark: SparkSession, file: str
) -> list[SqlError]:
    """The error of every view of ``text`` that does not compile (:func:`compile_sql` raises
    the first), each naming the file, line and view; a view that reads one of them is not
    compiled (its error would be that one's).  Spark analyses each view afresh."""
    views = parse_views(text, file)
    compiler = _Compiler(Circuit("check"), {k.lower(): parse_schema(v) for k, v in schemas.items()}, spark, Analyses())
    errors, failed = [], set()
    for view in views:
        if read_tables(view.query) & failed:
            failed.add(view.name.lower())
            continue
        try:
            compiler.view(view)
        except SqlError as e:
            errors.append(e)
            failed.add(view.name.lower())
    if not any(v.materialized for v in views):
        errors.append(_no_output(file))
    return errors


def _no_output(file: str) -> SqlError:
    return SqlError(f"{file}: no CREATE MATERIALIZED VIEW; a views file needs at least one")
