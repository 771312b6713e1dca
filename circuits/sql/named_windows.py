"""Named windows: ``SELECT f(x) OVER w ... WINDOW w AS (PARTITION BY p ORDER BY o frame)``.

Spark resolves each use of a named window (``OVER w`` or ``OVER (w)``) to the window's
definition before anything else; so does the compiler, by writing the definition into each
use and dropping the ``WINDOW`` clause.  The view is then the same query with its windows
written in ``OVER (...)``, compiled and checked as such.
"""

from __future__ import annotations

from sqlglot import exp

from .errors import SqlError, construct

_SPEC = ("partition_by", "order", "spec")
"""What a window's definition gives each use of it."""


def inline_named_windows(query: exp.Expression) -> exp.Expression:
    """``query`` with every use of a named window replaced by its definition (in place)."""
    for select in list(query.find_all(exp.Select)):
        named = select.args.get("windows")
        if not named:
            continue
        definitions: dict[str, exp.Window] = {}
        for definition in named:
            name = definition.this.name.lower()
            if name in definitions:
                raise SqlError(
                    f"the named window {name} is defined twice in one WINDOW clause; name each window once",
                    definition,
                )
            definitions[name] = definition
        for window in list(select.find_all(exp.Window)):
            if window.arg_key != "windows" and window.find_ancestor(exp.Select) is select:
                _resolve(window, definitions)
        select.set("windows", None)
    return query


def _resolve(window: exp.Window, definitions: dict[str, exp.Window]) -> None:
    """Gives ``window`` (a use of a named window, if its alias names one) the definition's
    partition, order and frame."""
    alias = window.args.get("alias")
    definition = definitions.get(alias.name.lower()) if alias is not None else None
    if definition is None:
        return
    if any(window.args.get(k) for k in _SPEC):
        raise SqlError(
            f"the window {construct(window)} adds to the named window {alias.name}, which Spark does not "
            "allow; write the whole window in OVER (...)",
            window,
        )
    copied = definition.copy()
    for key in _SPEC:
        window.set(key, copied.args.get(key))
    window.set("alias", None)
