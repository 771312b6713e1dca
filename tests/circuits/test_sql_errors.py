"""A views file that does not load is refused before anything runs, naming the file, the
line, the view and the construct (the parser's checks without Spark; the compiler's, at
the end, with Spark)."""

from __future__ import annotations

import pytest
from sqlglot import exp

from circuits.errors import DbspError
from circuits.sql import SqlError, compile_sql, parse_views


def refusal(text: str) -> str:
    with pytest.raises(SqlError) as raised:
        parse_views(text, "views.sql")
    assert isinstance(raised.value, DbspError)
    return str(raised.value)


def refusal_of_second_view(query: str) -> str:
    """The refusal of ``query`` as the file's second view, after the place it names."""
    message = refusal(f"CREATE MATERIALIZED VIEW ok AS SELECT k FROM a;\n\nCREATE MATERIALIZED VIEW bad AS\n  {query};")
    assert message.startswith("views.sql:4, view 'bad': ")
    return message.removeprefix("views.sql:4, view 'bad': ")


@pytest.mark.parametrize(
    "query, construct",
    [
        ("SELECT k, collect_list(v) OVER (PARTITION BY k) AS l FROM a", "the window function COLLECT_LIST(v)"),
        ("SELECT k, first_value(v) OVER (PARTITION BY k ORDER BY v) AS f FROM a", "over a RANGE frame (the default)"),
        ("SELECT k, sum(v) OVER w AS s FROM a", "names no window of the query's WINDOW clause"),
        ("SELECT k FROM a WHERE v IN (SELECT lag(x) OVER (ORDER BY x) FROM b)", "in an IN or EXISTS subquery"),
        ("SELECT k FROM a LIMIT 0", "LIMIT 0 (only LIMIT k with k a positive integer"),
        ("SELECT k FROM (SELECT k FROM a LIMIT 3) t", "LIMIT without ORDER BY"),
        ("SELECT k, count(*) AS n FROM a GROUP BY k LIMIT 3", "LIMIT without ORDER BY"),
        ("SELECT k FROM a ORDER BY k LIMIT 3 OFFSET 1", "no OFFSET"),
        ("SELECT k FROM (SELECT k FROM a ORDER BY k LIMIT 3) t", "ORDER BY ... LIMIT inside a query"),
        ("SELECT k, rand() AS r FROM a", "rand()"),
        ("SELECT k, current_timestamp() AS t FROM a", "current_timestamp()"),
        ("SELECT k, uuid() AS u FROM a", "uuid()"),
        ("SELECT k, skewness(v) FILTER (WHERE v > 1) AS n FROM a GROUP BY k", "the aggregate SKEWNESS(v)"),
        ("SELECT explode(array(k, v)) AS e FROM a", "explode()"),
    ],
)
def test_unsupported_constructs_are_refused_with_view_and_line(query, construct):
    message = refusal_of_second_view(query)
    assert message.startswith("not supported")
    assert construct in message


@pytest.mark.parametrize(
    "call, named",
    [
        ("skewness(v)", "skewness(v)"),
        ("kurtosis(v)", "kurtosis(v)"),
        ("try_sum(v)", "try_sum(v)"),
        ("mode(v)", "mode(v)"),
        ("corr(v, k)", "corr(v, k)"),
        ("percentile_cont(0.5) WITHIN GROUP (ORDER BY v)", "percentile_cont(0.5)"),
    ],
)
def test_aggregates_the_engine_lacks_are_refused_as_aggregates(call, named):
    """Spark's aggregates that the engine does not maintain are named as aggregates, at
    parse time (``try_sum``, which sqlglot reads as a plain function, too: left as a
    projection, it would be refused as "Spark cannot analyse" the compiler's rewrite)."""
    message = refusal(f"CREATE MATERIALIZED VIEW bad AS\n  SELECT k, {call} AS b FROM a GROUP BY k;")
    assert message.lower().startswith(
        f"views.sql:2, view 'bad': not supported in a maintained view: the aggregate {named}"
    )
    assert "count, sum, avg, min, max, bool_and (every), bool_or (some, any), count_if, stddev_samp" in message


@pytest.mark.parametrize("call", ["first(v)", "last(v)", "first(v, true)", "last(v) IGNORE NULLS", "any_value(v)"])
def test_aggregates_of_whichever_row_comes_first_are_refused(call):
    """``first``, ``last`` and ``any_value`` give whichever row Spark meets first or last,
    not a function of the rows: refused, naming the aggregates that say which row."""
    message = refusal(f"CREATE MATERIALIZED VIEW bad AS\n  SELECT k, {call} AS b FROM a GROUP BY k;")
    assert message.startswith("views.sql:2, view 'bad': not supported in a maintained view: ")
    assert "not a function of the rows); write min, max, max_by(x, y) or min_by(x, y)" in message


@pytest.mark.parametrize("call", ["std(v)", "stddev(v)", "variance(v)", "max_by(s, v)", "percentile(v, 0.5)"])
def test_statistical_and_recomputed_aggregates_parse(call):
    """The moments and Spark's recomputed aggregates load (``std``, a plain function to
    sqlglot, is ``stddev``)."""
    (view,) = parse_views(f"CREATE MATERIALIZED VIEW ok AS SELECT k, {call} AS b FROM a GROUP BY k;", "views.sql")
    assert isinstance(view.query.expressions[1].this, exp.AggFunc)


@pytest.mark.parametrize("call", ["every(v > 1)", "some(v > 1)", "any(v > 1)", "bool_and(v > 1)", "count_if(v > 1)"])
def test_boolean_aggregates_are_taken_for_the_aggregates_they_are(call):
    """``every``, ``some`` and ``any`` (plain functions to sqlglot) are ``bool_and`` and
    ``bool_or``; ``x = ANY (subquery)`` is a comparison, not the aggregate."""
    (view,) = parse_views(f"CREATE MATERIALIZED VIEW ok AS SELECT k, {call} AS b FROM a GROUP BY k;", "views.sql")
    assert isinstance(view.query.expressions[1].this, (exp.LogicalAnd, exp.LogicalOr, exp.CountIf))
    parse_views("CREATE MATERIALIZED VIEW ok AS SELECT k FROM a WHERE k = ANY (SELECT k FROM b);", "views.sql")


def test_a_column_beside_windows_neither_grouped_nor_aggregated_is_refused_at_its_line():
    message = refusal(
        "CREATE MATERIALIZED VIEW bad AS\n  SELECT k, rank() OVER (ORDER BY sum(v)) AS r,\n  v FROM a GROUP BY k, v + 1;"
    )
    assert message.startswith("views.sql:3, view 'bad': v beside window functions in a query with GROUP BY")
    assert "neither grouped nor inside an aggregate; group by it or aggregate it" in message


def test_a_named_window_is_written_into_its_uses():
    (view,) = parse_views(
        "CREATE MATERIALIZED VIEW v AS SELECT k, sum(v) OVER w AS s, rank() OVER (w) AS r FROM a\n"
        "WINDOW w AS (PARTITION BY k ORDER BY v ROWS BETWEEN 1 PRECEDING AND CURRENT ROW);"
    )
    windows = list(view.query.find_all(exp.Window))
    assert [w.sql("spark") for w in windows] == [
        "SUM(v) OVER (PARTITION BY k ORDER BY v ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)",
        "RANK() OVER (PARTITION BY k ORDER BY v ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)",
    ]
    assert not view.query.args.get("windows")


@pytest.mark.parametrize(
    "query, reason",
    [
        ("SELECT k, sum(v) OVER w AS s FROM a WINDOW w AS (PARTITION BY k), w AS ()", "is defined twice"),
        ("SELECT k, rank() OVER (w ORDER BY v) AS r FROM a WINDOW w AS (PARTITION BY k)", "adds to the named window"),
    ],
)
def test_a_named_window_spark_would_not_take_is_refused_at_its_line(query, reason):
    assert reason in refusal_of_second_view(query)


def test_a_refusal_names_its_construct_whole():
    window = (
        "COLLECT_LIST(v) OVER (PARTITION BY k, v + 1, v + 2, v + 3 ORDER BY v DESC, k "
        "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)"
    )
    message = refusal(f"CREATE MATERIALIZED VIEW bad AS SELECT k, {window} AS l FROM a;")
    assert len(window) > 100 and f"the window function {window} (the engine maintains" in message


def test_other_statements_are_refused():
    message = refusal("CREATE TABLE t (k int);")
    assert message.startswith("views.sql:1:") and "CREATE MATERIALIZED VIEW" in message


def test_a_syntax_error_names_its_line():
    message = refusal(
        "CREATE MATERIALIZED VIEW a AS SELECT k FROM t;\n\nCREATE MATERIALIZED VIEW b AS SELECT (k FROM t;"
    )
    assert message.startswith("views.sql:3") and "syntax error" in message


def test_a_syntax_error_in_a_query_names_the_line_of_its_token_and_sqlglot_stays_quiet(capfd):
    """sqlglot gives up on the whole CREATE (a bare command, with a warning to stderr): the
    query is parsed alone to find the token."""
    message = refusal(
        "CREATE MATERIALIZED VIEW a AS SELECT k FROM t;\n\nCREATE MATERIALIZED VIEW b AS\n  SELECT k,\n    v +* 2\n  FROM t;"
    )
    assert message.startswith("views.sql:5: syntax error:") and "at '2' (column" in message, message
    assert capfd.readouterr().err == ""


def test_two_views_of_one_name_are_refused():
    message = refusal("CREATE MATERIALIZED VIEW v AS SELECT k FROM t;\nCREATE TEMPORARY VIEW V AS SELECT k FROM u;")
    assert message.startswith("views.sql:2, view 'V'") and "line 1" in message


def test_a_cycle_between_views_is_refused():
    message = refusal(
        "CREATE MATERIALIZED VIEW a AS SELECT k FROM c;\n"
        "CREATE TEMPORARY VIEW b AS SELECT k FROM a;\n"
        "CREATE TEMPORARY VIEW c AS SELECT k FROM b;"
    )
    assert "cycle (a -> c -> b -> a)" in message and message.startswith("views.sql:1, view 'a'")


def test_views_come_in_dependency_order_with_their_text():
    views = parse_views(
        "-- reads a view defined below\nCREATE MATERIALIZED VIEW top AS SELECT k FROM base;\n"
        "CREATE TEMPORARY VIEW base AS\n  SELECT k AS k FROM t WHERE v > 1;",
        "views.sql",
    )
    assert [(v.name, v.line, v.materialized) for v in views] == [("base", 3, False), ("top", 2, True)]
    assert views[0].text == "SELECT k AS k FROM t WHERE v > 1"


SCHEMAS = {"a": "k int, v int, s string", "b": "k bigint, x int, d double"}


def compile_refusal(spark, query: str) -> str:
    with pytest.raises(SqlError) as raised:
        compile_sql(
            f"CREATE MATERIALIZED VIEW fine AS SELECT k FROM a;\nCREATE MATERIALIZED VIEW bad AS\n{query};",
            SCHEMAS,
            spark,
            file="views.sql",
        )
    return str(raised.value)


def test_compiler_refusals_name_the_construct_seen_and_its_line(spark):
    """The compiler's refusals (with Spark) blame what the query holds, at its line: an
    ``IN`` subquery is named as such, not as a scalar subquery, and vice versa."""
    message = compile_refusal(spark, "SELECT k FROM a GROUP BY k\nHAVING k = 1\n  OR k IN (SELECT x FROM b)")
    assert message.startswith("views.sql:5, view 'bad': IN subquery in HAVING or beside aggregates"), message
    message = compile_refusal(
        spark, "SELECT k, count(*) AS n,\n  EXISTS (SELECT 1 FROM b WHERE b.k = a.k) AS e FROM a GROUP BY k"
    )
    assert message.startswith("views.sql:4, view 'bad': EXISTS subquery in HAVING or beside aggregates"), message
    message = compile_refusal(spark, "SELECT k FROM a\nWHERE v > (SELECT m\n  FROM (SELECT x AS m FROM b) t)")
    assert message.startswith("views.sql:4, view 'bad': a scalar subquery that is not an aggregate")


def test_an_order_by_without_limit_is_ignored_with_a_notice(spark, caplog):
    """A view is a set of rows: its ``ORDER BY`` alone (or a subquery's) changes nothing,
    and loading the views says so, naming the view and the line."""
    text = "CREATE MATERIALIZED VIEW sorted AS\n  SELECT k FROM (SELECT k FROM a ORDER BY v) ORDER BY k;"
    compile_sql(text, SCHEMAS, spark, file="views.sql")
    notices = [r.getMessage() for r in caplog.records if "ORDER BY without LIMIT is ignored" in r.getMessage()]
    assert len(notices) == 2 and all(n.startswith("views.sql:2, view 'sorted': ") for n in notices), notices


def test_a_correlation_of_a_grouped_subquery_is_refused_as_such(spark):
    """An ``EXISTS``/``IN`` subquery with GROUP BY, aggregates or DISTINCT that reads a
    column of the enclosing query (Spark's ``exists-aggregate.sql``) is refused as that
    correlation: it was refused for an "unknown column" that exists."""
    message = compile_refusal(
        spark, "SELECT k FROM a\nWHERE EXISTS (SELECT max(x) FROM b\n  WHERE b.k = a.k GROUP BY b.k)"
    )
    assert message.startswith(
        "views.sql:5, view 'bad': EXISTS subquery with GROUP BY reads a.k of an enclosing query (a correlation): "
        "not supported; correlate a subquery without GROUP BY"
    )
    message = compile_refusal(spark, "SELECT k FROM a\nWHERE s NOT IN (SELECT DISTINCT s FROM a a2 WHERE a2.v = a.v)")
    assert message.startswith("views.sql:4, view 'bad': IN subquery with DISTINCT reads a.v of an enclosing query")
    message = compile_refusal(spark, "SELECT k FROM a\nWHERE v NOT IN ((SELECT min(x) FROM b WHERE b.k = a.k))")
    assert message.startswith("views.sql:4, view 'bad': IN subquery with aggregates reads a.k of an enclosing query")


def test_a_correlation_of_a_scalar_subquery_in_having_is_refused_as_such(spark):
    """scalar-subquery-predicate.sql: a scalar subquery in HAVING whose subquery in FROM
    reads the enclosing query's column was refused for an "unknown column" that exists."""
    message = compile_refusal(
        spark, "SELECT k FROM a GROUP BY k\nHAVING k < (SELECT sum(x) FROM (SELECT x FROM b WHERE b.k > a.k) t)"
    )
    assert message.startswith(
        "views.sql:4, view 'bad': a scalar subquery in HAVING or beside aggregates reads a.k of the enclosing query"
    )


def test_nested_in_subqueries_under_a_scalar_one_compile(spark):
    """TPC-H q20's shape: ``IN`` inside an ``IN`` subquery, beside a scalar subquery
    correlated with the middle one, was refused as "unknown column" (a column of the
    innermost subquery taken for a correlated one)."""
    compile_sql(
        "CREATE MATERIALIZED VIEW q20 AS SELECT s FROM a WHERE k IN (SELECT b.k FROM b WHERE b.x IN "
        "(SELECT v FROM a a3 WHERE a3.s = 'x') AND b.x > (SELECT count(*) FROM a a2 WHERE a2.k = b.k));",
        SCHEMAS,
        spark,
    )
