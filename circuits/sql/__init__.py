"""The SQL front end: a file of Spark SQL views compiled into one circuit."""

from .compiler import compile_sql
from .errors import SqlError
from .parse import View, parse_views

__all__ = ["SqlError", "View", "compile_sql", "parse_views"]
