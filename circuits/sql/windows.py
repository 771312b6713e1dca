"""Which window functions' values depend on the order of rows tied under their ``ORDER BY``,
for the compiler (:mod:`circuits.sql.compiler.windowed`) and the oracle alike.

Which row comes first among rows equal under a window's ``ORDER BY`` is Spark's choice,
and some functions' values depend on it: ``ROW_NUMBER``, ``NTILE``, ``LAG``, ``LEAD`` and
every function over a ``ROWS`` frame.  Their order is made total by the FROM's columns
(``struct(*)``: each column ascending, nulls first), after the window's own order, as the
top-k's ``ROW_NUMBER``; over a query's groups, by its grouping expressions and aggregate
calls (:func:`circuits.sql.grouped_windows.groups_columns`); the oracle (:func:`circuits.sql.batch.tie_broken`) appends the
same.  The other functions' values do not depend on it (ranks and ``RANGE`` frames take
tied rows together), but for ``FIRST_VALUE``/``LAST_VALUE``/``NTH_VALUE``, which are
refused over a ``RANGE`` frame (see :mod:`circuits.sql.parse`).
"""

from __future__ import annotations

from sqlglot import exp

from .parse import rows_frame, window_function

ORDERED = (exp.RowNumber, exp.Ntile, exp.Lag, exp.Lead)
"""The functions whose value depends on the order of rows equal under ``ORDER BY``, over
any frame (they take none)."""


def order_dependent(window: exp.Window) -> bool:
    """``window``'s value depends on the order of its rows tied under its ``ORDER BY``."""
    return isinstance(window_function(window), ORDERED) or rows_frame(window)
