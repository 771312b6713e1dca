"""The SQL front end: a file of Spark SQL views compiled into one circuit."""

from .batch import batch_views, standalone_sql
from .compiler import compile_sql
from .errors import SqlError
from .parse import View, parse_views

__all__ = ["SqlError", "batch_views", "View", "compile_sql", "parse_views", "standalone_sql"]
