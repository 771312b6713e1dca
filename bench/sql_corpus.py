"""A public SQL corpus through the SQL front end: which queries compile, which are refused
(and why), and whether every compiled one equals Spark batch SQL of the same text.

Each query is wrapped as ``CREATE MATERIALIZED VIEW``, compiled alone (``compile_sql``) and
run for ``--steps`` steps of generated inserts and deletes (tens of rows per table, with
NULLs and duplicates; later steps delete present rows). At every step the integral of the
view's outputs is compared with Spark batch SQL of the query over the integrated inputs.
Each query ends in one of five outcomes:

- ``match``: compiled, and equal to Spark batch SQL at every step (the view's row count
  at each step is printed, to show the data reached it);
- ``mismatch``: compiled, but differs at some step (a compiler bug: the query, the step
  and the rows missing and extra are printed);
- ``refused``: Spark analyses the query, but the compiler refuses it (its ``SqlError``);
- ``not Spark SQL``: Spark itself rejects the query (another dialect's construct), or
  fails it on the data (a step failed, and so does Spark batch SQL of the same text);
- ``error``: compiled, but a step failed where Spark batch SQL does not (a compiler bug too:
  it should have been refused).

The query files are third-party and are not in this repository; name them on the command
line (both are plain files in public repositories):

- ``--tpch FILE``: sqlglot's ``tests/fixtures/optimizer/tpc-h/tpc-h.sql`` (MIT; TPC-H's 22
  queries with the specification's validation parameters, each followed by sqlglot's
  optimized form, which is skipped);
- ``--tpcds PATH``: the ``sql/core/src/test/resources/tpcds`` folder of ``apache/spark``
  (Apache-2.0; TPC-DS's 103 queries as Spark runs them, one ``qN.sql`` each), or sqlglot's
  ``tests/fixtures/optimizer/tpc-ds/tpc-ds.sql`` (MIT; 99 queries, each followed by its
  optimized form, skipped);
- ``--nexmark DIR``: the ``nexmark-flink/src/main/resources/queries`` folder of the Nexmark
  benchmark's repository (``nexmark/nexmark``, Apache-2.0; Flink SQL): each ``qN.sql``'s
  ``INSERT INTO sink SELECT ...`` becomes the materialized view ``sink`` and its
  ``CREATE VIEW``s temporary views; ``CREATE TABLE`` (sink DDL) is dropped.
- ``--spark-tests PATH...``: files (or folders of them) of Spark's own SQL tests,
  ``sql/core/src/test/resources/sql-tests/inputs/`` in ``apache/spark`` (Apache-2.0). A
  file defines its inputs (``CREATE [OR REPLACE] [TEMPORARY] VIEW t AS [SELECT * FROM]
  VALUES ...``, or ``CREATE TABLE t (...) USING ...`` and ``INSERT INTO t VALUES ...``;
  Spark evaluates the values and gives their types) and queries them. Each query is a
  view over the inputs as defined at that point of the file, fed the inputs' own rows:
  split over the steps in a random order, each step but the last deleting about a third
  of the rows present and the next inserting them again (so the last step holds the
  file's tables whole). The other statements are counted as ``not a view``, by kind:
  input definitions, ``SET``, DDL, other commands, queries that read none of the
  file's inputs, non-deterministic queries (the compiler's refusal).

Each query is taken as written: a top-level ``ORDER BY`` without ``LIMIT`` is the engine's
to ignore (a view is a set), ``ORDER BY ... LIMIT`` is a top-k. Where Spark may pick any
of tied rows (``ORDER BY ... LIMIT``, ``ROW_NUMBER()``), the oracle is Spark batch SQL of
the text with the engine's tie-break appended to the ``ORDER BY``
(``circuits.sql.batch.tie_broken``). Nothing else is rewritten: Flink-only constructs
(window TVFs, ``PROCTIME()``) are reported as they are.

    python bench/sql_corpus.py --tpch tpc-h.sql --nexmark queries/ --steps 3
    python bench/sql_corpus.py --spark-tests inputs/group-by.sql inputs/subquery/in-subquery
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import logging
import os
import random
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import sqlglot
from pyspark.errors import PySparkException
from pyspark.logger import PySparkLogger
from pyspark.sql import functions as F
from pyspark.sql import types as T
from sqlglot import exp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from circuits import InMemoryStateStore, StepRunner, from_rows
from circuits.errors import DbspError
from circuits.spark import local_session
from circuits.sql import SqlError, compile_sql
from circuits.sql.batch import tie_broken
from circuits.sql.parse import DIALECT, read_tables
from circuits.sql.parse import _statements as split_statements
from circuits.zset import parse_schema

TPCH = {
    "nation": "n_nationkey bigint, n_name string, n_regionkey bigint, n_comment string",
    "region": "r_regionkey bigint, r_name string, r_comment string",
    "part": "p_partkey bigint, p_name string, p_mfgr string, p_brand string, p_type string, p_size int, "
    "p_container string, p_retailprice decimal(15,2), p_comment string",
    "supplier": "s_suppkey bigint, s_name string, s_address string, s_nationkey bigint, s_phone string, "
    "s_acctbal decimal(15,2), s_comment string",
    "partsupp": "ps_partkey bigint, ps_suppkey bigint, ps_availqty int, ps_supplycost decimal(15,2), ps_comment string",
    "customer": "c_custkey bigint, c_name string, c_address string, c_nationkey bigint, c_phone string, "
    "c_acctbal decimal(15,2), c_mktsegment string, c_comment string",
    "orders": "o_orderkey bigint, o_custkey bigint, o_orderstatus string, o_totalprice decimal(15,2), o_orderdate date, "
    "o_orderpriority string, o_clerk string, o_shippriority int, o_comment string",
    "lineitem": "l_orderkey bigint, l_partkey bigint, l_suppkey bigint, l_linenumber int, l_quantity decimal(15,2), "
    "l_extendedprice decimal(15,2), l_discount decimal(15,2), l_tax decimal(15,2), l_returnflag string, "
    "l_linestatus string, l_shipdate date, l_commitdate date, l_receiptdate date, l_shipinstruct string, "
    "l_shipmode string, l_comment string",
}
"""TPC-H's eight tables (specification 2.4), with Spark's types."""

TPCDS = {
    "call_center": "cc_call_center_sk int, cc_call_center_id string, cc_rec_start_date date, cc_rec_end_date date, cc_closed_date_sk int, cc_open_date_sk int, cc_name string, cc_class string, cc_employees int, cc_sq_ft int, cc_hours string, cc_manager string, cc_mkt_id int, cc_mkt_class string, cc_mkt_desc string, cc_market_manager string, cc_division int, cc_division_name string, cc_company int, cc_company_name string, cc_street_number string, cc_street_name string, cc_street_type string, cc_suite_number string, cc_city string, cc_county string, cc_state string, cc_zip string, cc_country string, cc_gmt_offset decimal(5,2), cc_tax_percentage decimal(5,2)",
    "catalog_page": "cp_catalog_page_sk int, cp_catalog_page_id string, cp_start_date_sk int, cp_end_date_sk int, cp_department string, cp_catalog_number int, cp_catalog_page_number int, cp_description string, cp_type string",
    "catalog_returns": "cr_returned_date_sk int, cr_returned_time_sk int, cr_item_sk int, cr_refunded_customer_sk int, cr_refunded_cdemo_sk int, cr_refunded_hdemo_sk int, cr_refunded_addr_sk int, cr_returning_customer_sk int, cr_returning_cdemo_sk int, cr_returning_hdemo_sk int, cr_returning_addr_sk int, cr_call_center_sk int, cr_catalog_page_sk int, cr_ship_mode_sk int, cr_warehouse_sk int, cr_reason_sk int, cr_order_number int, cr_return_quantity int, cr_return_amount decimal(7,2), cr_return_tax decimal(7,2), cr_return_amt_inc_tax decimal(7,2), cr_fee decimal(7,2), cr_return_ship_cost decimal(7,2), cr_refunded_cash decimal(7,2), cr_reversed_charge decimal(7,2), cr_store_credit decimal(7,2), cr_net_loss decimal(7,2)",
    "catalog_sales": "cs_sold_date_sk int, cs_sold_time_sk int, cs_ship_date_sk int, cs_bill_customer_sk int, cs_bill_cdemo_sk int, cs_bill_hdemo_sk int, cs_bill_addr_sk int, cs_ship_customer_sk int, cs_ship_cdemo_sk int, cs_ship_hdemo_sk int, cs_ship_addr_sk int, cs_call_center_sk int, cs_catalog_page_sk int, cs_ship_mode_sk int, cs_warehouse_sk int, cs_item_sk int, cs_promo_sk int, cs_order_number int, cs_quantity int, cs_wholesale_cost decimal(7,2), cs_list_price decimal(7,2), cs_sales_price decimal(7,2), cs_ext_discount_amt decimal(7,2), cs_ext_sales_price decimal(7,2), cs_ext_wholesale_cost decimal(7,2), cs_ext_list_price decimal(7,2), cs_ext_tax decimal(7,2), cs_coupon_amt decimal(7,2), cs_ext_ship_cost decimal(7,2), cs_net_paid decimal(7,2), cs_net_paid_inc_tax decimal(7,2), cs_net_paid_inc_ship decimal(7,2), cs_net_paid_inc_ship_tax decimal(7,2), cs_net_profit decimal(7,2)",
    "customer": "c_customer_sk int, c_customer_id string, c_current_cdemo_sk int, c_current_hdemo_sk int, c_current_addr_sk int, c_first_shipto_date_sk int, c_first_sales_date_sk int, c_salutation string, c_first_name string, c_last_name string, c_preferred_cust_flag string, c_birth_day int, c_birth_month int, c_birth_year int, c_birth_country string, c_login string, c_email_address string, c_last_review_date string",
    "customer_address": "ca_address_sk int, ca_address_id string, ca_street_number string, ca_street_name string, ca_street_type string, ca_suite_number string, ca_city string, ca_county string, ca_state string, ca_zip string, ca_country string, ca_gmt_offset decimal(5,2), ca_location_type string",
    "customer_demographics": "cd_demo_sk int, cd_gender string, cd_marital_status string, cd_education_status string, cd_purchase_estimate int, cd_credit_rating string, cd_dep_count int, cd_dep_employed_count int, cd_dep_college_count int",
    "date_dim": "d_date_sk int, d_date_id string, d_date date, d_month_seq int, d_week_seq int, d_quarter_seq int, d_year int, d_dow int, d_moy int, d_dom int, d_qoy int, d_fy_year int, d_fy_quarter_seq int, d_fy_week_seq int, d_day_name string, d_quarter_name string, d_holiday string, d_weekend string, d_following_holiday string, d_first_dom int, d_last_dom int, d_same_day_ly int, d_same_day_lq int, d_current_day string, d_current_week string, d_current_month string, d_current_quarter string, d_current_year string",
    "household_demographics": "hd_demo_sk int, hd_income_band_sk int, hd_buy_potential string, hd_dep_count int, hd_vehicle_count int",
    "income_band": "ib_income_band_sk int, ib_lower_bound int, ib_upper_bound int",
    "inventory": "inv_date_sk int, inv_item_sk int, inv_warehouse_sk int, inv_quantity_on_hand int",
    "item": "i_item_sk int, i_item_id string, i_rec_start_date date, i_rec_end_date date, i_item_desc string, i_current_price decimal(7,2), i_wholesale_cost decimal(7,2), i_brand_id int, i_brand string, i_class_id int, i_class string, i_category_id int, i_category string, i_manufact_id int, i_manufact string, i_size string, i_formulation string, i_color string, i_units string, i_container string, i_manager_id int, i_product_name string",
    "promotion": "p_promo_sk int, p_promo_id string, p_start_date_sk int, p_end_date_sk int, p_item_sk int, p_cost decimal(7,2), p_response_target int, p_promo_name string, p_channel_dmail string, p_channel_email string, p_channel_catalog string, p_channel_tv string, p_channel_radio string, p_channel_press string, p_channel_event string, p_channel_demo string, p_channel_details string, p_purpose string, p_discount_active string",
    "reason": "r_reason_sk int, r_reason_id string, r_reason_desc string",
    "ship_mode": "sm_ship_mode_sk int, sm_ship_mode_id string, sm_type string, sm_code string, sm_carrier string, sm_contract string",
    "store": "s_store_sk int, s_store_id string, s_rec_start_date date, s_rec_end_date date, s_closed_date_sk int, s_store_name string, s_number_employees int, s_floor_space int, s_hours string, s_manager string, s_market_id int, s_geography_class string, s_market_desc string, s_market_manager string, s_division_id int, s_division_name string, s_company_id int, s_company_name string, s_street_number string, s_street_name string, s_street_type string, s_suite_number string, s_city string, s_county string, s_state string, s_zip string, s_country string, s_gmt_offset decimal(5,2), s_tax_precentage decimal(5,2)",
    "store_returns": "sr_returned_date_sk int, sr_return_time_sk int, sr_item_sk int, sr_customer_sk int, sr_cdemo_sk int, sr_hdemo_sk int, sr_addr_sk int, sr_store_sk int, sr_reason_sk int, sr_ticket_number int, sr_return_quantity int, sr_return_amt decimal(7,2), sr_return_tax decimal(7,2), sr_return_amt_inc_tax decimal(7,2), sr_fee decimal(7,2), sr_return_ship_cost decimal(7,2), sr_refunded_cash decimal(7,2), sr_reversed_charge decimal(7,2), sr_store_credit decimal(7,2), sr_net_loss decimal(7,2)",
    "store_sales": "ss_sold_date_sk int, ss_sold_time_sk int, ss_item_sk int, ss_customer_sk int, ss_cdemo_sk int, ss_hdemo_sk int, ss_addr_sk int, ss_store_sk int, ss_promo_sk int, ss_ticket_number int, ss_quantity int, ss_wholesale_cost decimal(7,2), ss_list_price decimal(7,2), ss_sales_price decimal(7,2), ss_ext_discount_amt decimal(7,2), ss_ext_sales_price decimal(7,2), ss_ext_wholesale_cost decimal(7,2), ss_ext_list_price decimal(7,2), ss_ext_tax decimal(7,2), ss_coupon_amt decimal(7,2), ss_net_paid decimal(7,2), ss_net_paid_inc_tax decimal(7,2), ss_net_profit decimal(7,2)",
    "time_dim": "t_time_sk int, t_time_id string, t_time int, t_hour int, t_minute int, t_second int, t_am_pm string, t_shift string, t_sub_shift string, t_meal_time string",
    "warehouse": "w_warehouse_sk int, w_warehouse_id string, w_warehouse_name string, w_warehouse_sq_ft int, w_street_number string, w_street_name string, w_street_type string, w_suite_number string, w_city string, w_county string, w_state string, w_zip string, w_country string, w_gmt_offset decimal(5,2)",
    "web_page": "wp_web_page_sk int, wp_web_page_id string, wp_rec_start_date date, wp_rec_end_date date, wp_creation_date_sk int, wp_access_date_sk int, wp_autogen_flag string, wp_customer_sk int, wp_url string, wp_type string, wp_char_count int, wp_link_count int, wp_image_count int, wp_max_ad_count int",
    "web_returns": "wr_returned_date_sk int, wr_returned_time_sk int, wr_item_sk int, wr_refunded_customer_sk int, wr_refunded_cdemo_sk int, wr_refunded_hdemo_sk int, wr_refunded_addr_sk int, wr_returning_customer_sk int, wr_returning_cdemo_sk int, wr_returning_hdemo_sk int, wr_returning_addr_sk int, wr_web_page_sk int, wr_reason_sk int, wr_order_number int, wr_return_quantity int, wr_return_amt decimal(7,2), wr_return_tax decimal(7,2), wr_return_amt_inc_tax decimal(7,2), wr_fee decimal(7,2), wr_return_ship_cost decimal(7,2), wr_refunded_cash decimal(7,2), wr_reversed_charge decimal(7,2), wr_account_credit decimal(7,2), wr_net_loss decimal(7,2)",
    "web_sales": "ws_sold_date_sk int, ws_sold_time_sk int, ws_ship_date_sk int, ws_item_sk int, ws_bill_customer_sk int, ws_bill_cdemo_sk int, ws_bill_hdemo_sk int, ws_bill_addr_sk int, ws_ship_customer_sk int, ws_ship_cdemo_sk int, ws_ship_hdemo_sk int, ws_ship_addr_sk int, ws_web_page_sk int, ws_web_site_sk int, ws_ship_mode_sk int, ws_warehouse_sk int, ws_promo_sk int, ws_order_number int, ws_quantity int, ws_wholesale_cost decimal(7,2), ws_list_price decimal(7,2), ws_sales_price decimal(7,2), ws_ext_discount_amt decimal(7,2), ws_ext_sales_price decimal(7,2), ws_ext_wholesale_cost decimal(7,2), ws_ext_list_price decimal(7,2), ws_ext_tax decimal(7,2), ws_coupon_amt decimal(7,2), ws_ext_ship_cost decimal(7,2), ws_net_paid decimal(7,2), ws_net_paid_inc_tax decimal(7,2), ws_net_paid_inc_ship decimal(7,2), ws_net_paid_inc_ship_tax decimal(7,2), ws_net_profit decimal(7,2)",
    "web_site": "web_site_sk int, web_site_id string, web_rec_start_date date, web_rec_end_date date, web_name string, web_open_date_sk int, web_close_date_sk int, web_class string, web_manager string, web_mkt_id int, web_mkt_class string, web_mkt_desc string, web_market_manager string, web_company_id int, web_company_name string, web_street_number string, web_street_name string, web_street_type string, web_suite_number string, web_city string, web_county string, web_state string, web_zip string, web_country string, web_gmt_offset string, web_tax_percentage decimal(5,2)",
}
"""TPC-DS's 24 tables (specification 2.x, section 2): identifiers and integers as ``int``,
decimals as the specification's ``decimal(7,2)`` (``decimal(5,2)`` for GMT offsets and tax
percentages), ``char``/``varchar`` as ``string``, dates as ``date``."""

NEXMARK = {
    "person": "id bigint, name string, emailAddress string, creditCard string, city string, state string, "
    "dateTime timestamp, extra string",
    "auction": "id bigint, itemName string, description string, initialBid bigint, reserve bigint, dateTime timestamp, "
    "expires timestamp, seller bigint, category bigint, extra string",
    "bid": "auction bigint, bidder bigint, price bigint, channel string, url string, dateTime timestamp, extra string",
}
"""The Nexmark repository's ``ddl_views.sql`` views, as tables."""


@dataclass
class Tables:
    """Input tables and their rows (names in lower case, as the compiler keys its inputs)."""

    schemas: dict[str, T.StructType]
    rows: dict[str, list[tuple]]


@dataclass
class Query:
    name: str
    views: str
    """A views file: the query as ``CREATE MATERIALIZED VIEW``, after any temporary views."""
    tables: Tables | None = None
    """The query's own inputs (a Spark test file's), else the corpus's generated ones."""


def _statements(text: str) -> list[str]:
    """``text``'s statements, split as the front end splits a views file."""
    return [statement.strip() for statement, _ in split_statements(text, "<corpus>")]


def _materialized(name: str, select: str) -> Query:
    return Query(name, f"CREATE MATERIALIZED VIEW {name} AS\n{select};")


def tpch_queries(path: Path) -> list[Query]:
    return _banner_queries(path, "TPC-H", "tpch")


def tpcds_queries(path: Path) -> list[Query]:
    """A folder of ``qN.sql`` files (Spark's ``sql/core/src/test/resources/tpcds``: 103
    queries, ``q14a``/``q14b`` and the like apart), or sqlglot's file of 99 banners."""
    if not path.is_dir():
        return _banner_queries(path, "TPC-DS", "tpcds")

    def number(p: Path) -> tuple[int, str]:
        return int(re.sub(r"\D", "", p.stem)), p.stem

    files = sorted((p for p in path.glob("q*.sql") if re.fullmatch(r"q\d+[a-z]?", p.stem)), key=number)
    return [_materialized(f"tpcds_{p.stem}", _statements(re.sub(r"--[^\n]*", "", p.read_text()))[0]) for p in files]


def _banner_queries(path: Path, banner: str, prefix: str) -> list[Query]:
    """The first statement after each ``-- <banner> N`` banner of one of sqlglot's fixture
    files (sqlglot's optimized form follows it)."""
    # The fixture's directives (``# execute: true``) are no SQL; its quoted names are identifiers.
    text = re.sub(r'"([^"\n]*)"', r"`\1`", re.sub(r"^#[^\n]*\n", "", path.read_text(), flags=re.MULTILINE))
    sections = re.split(rf"^-+\n-- {banner} (\d+)\n-+\n", text, flags=re.MULTILINE)
    return [
        _materialized(f"{prefix}_q{number}", _statements(body)[0])
        for number, body in zip(sections[1::2], sections[2::2])
    ]


def nexmark_queries(folder: Path) -> list[Query]:
    def number(p: Path) -> int:
        return int(p.stem[1:])

    return [_nexmark_query(p) for p in sorted(folder.glob("q[0-9]*.sql"), key=number)]


def _nexmark_query(path: Path) -> Query:
    temporary, query = [], None
    for statement in _statements(re.sub(r"--[^\n]*", "", path.read_text())):
        head = statement[:200].upper()
        if head.startswith("CREATE VIEW"):
            temporary.append(re.sub(r"^CREATE VIEW", "CREATE TEMPORARY VIEW", statement, flags=re.IGNORECASE) + ";")
        elif head.startswith("INSERT INTO"):
            sink, select = re.match(
                r"INSERT\s+INTO\s+(\w+)\s+(.*)", statement, flags=re.DOTALL | re.IGNORECASE
            ).groups()
            query = _materialized(sink, select)
    return Query(query.name, "\n".join([*temporary, query.views]))


_VIEW = re.compile(
    r"CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP(?:ORARY)?\s+)?VIEW\s+(\w+)\s*(?:\(([^)]*)\))?\s+AS\s+(.*)",
    re.DOTALL | re.IGNORECASE,
)
_TABLE = re.compile(r"CREATE\s+TABLE\s+(\w+)\s*\((.*)\)\s*USING\s+\w+\s*$", re.DOTALL | re.IGNORECASE)
_INSERT = re.compile(r"INSERT\s+INTO\s+(?:TABLE\s+)?(\w+)\s+(VALUES\b.*)$", re.DOTALL | re.IGNORECASE)
_QUERY = re.compile(r"(SELECT|WITH|FROM|VALUES|TABLE)\b|\(", re.IGNORECASE)
_COMMANDS = {
    "SET": "SET",
    "RESET": "SET",
    **dict.fromkeys(["CREATE", "DROP", "ALTER", "TRUNCATE", "INSERT"], "DDL"),
}


class SparkTestFile:
    """One of Spark's SQL test files, read statement by statement: its inputs as defined so
    far (Spark evaluates their values), its queries over them, and what else it holds."""

    def __init__(self, spark, path: Path, name: str) -> None:
        self.spark, self.name = spark, name
        self.tables = Tables({}, {})
        self.queries: list[Query] = []
        self.not_views: Counter = Counter()
        for number, statement in enumerate(_statements(path.read_text()), 1):
            self.read(number, statement)

    def read(self, number: int, statement: str) -> None:
        kind = self.kind(number, statement)
        if kind is not None:
            self.not_views[kind] += 1

    def kind(self, number: int, statement: str) -> str | None:
        """What ``statement`` is, if not a view (None: taken as a query)."""
        try:
            defined = self.input_defined(statement)
        except PySparkException:
            return "an input Spark rejects"
        if defined:
            return defined
        if _QUERY.match(statement):
            return self.query(number, statement)
        head = statement.split(None, 1)[0].upper()
        return _COMMANDS.get(head, f"command ({head})")

    def input_defined(self, statement: str) -> str | None:
        """Takes the input ``statement`` defines, and says so; None if it defines none."""
        view, table, insert = (r.match(statement) for r in (_VIEW, _TABLE, _INSERT))
        if view and _reads(view.group(3)):
            return "a view of the inputs (not followed)"
        if view:
            frame = self.spark.sql(view.group(3))
            columns = view.group(2)
            self.set(view.group(1), frame.toDF(*[c.strip() for c in columns.split(",")]) if columns else frame)
        elif table:
            self.set(table.group(1), self.spark.createDataFrame([], table.group(2)))
        elif insert and insert.group(1).lower() in self.tables.schemas:
            schema = self.tables.schemas[insert.group(1).lower()]
            values = self.spark.sql(f"SELECT * FROM {insert.group(2)}")
            typed = values.select(*[F.col(c).cast(f.dataType) for c, f in zip(values.columns, schema.fields)])
            self.tables.rows[insert.group(1).lower()] += [tuple(r) for r in typed.collect()]
        else:
            return None
        return "defines an input"

    def set(self, name: str, frame) -> None:
        self.tables = Tables(
            {**self.tables.schemas, name.lower(): frame.schema},
            {**self.tables.rows, name.lower(): [tuple(r) for r in frame.collect()]},
        )

    def query(self, number: int, statement: str) -> str | None:
        """Takes ``statement`` as a query (None), or says why it is not a view."""
        read = _reads(statement)
        if read is not None and not read & set(self.tables.schemas):
            return "reads none of the file's inputs"
        query = _materialized(f"{self.name}_{number}", statement)
        self.queries.append(Query(query.name, query.views, self.tables))
        return None


def _reads(query: str) -> set[str] | None:
    """The tables ``query`` reads (lower case), or None if sqlglot cannot parse it."""
    try:
        return read_tables(sqlglot.parse_one(query, read=DIALECT))
    except sqlglot.errors.ParseError:
        return None


def spark_test_files(paths: list[Path]) -> list[Path]:
    """The ``.sql`` files named, those of a folder named in name order."""
    return [f for p in paths for f in (sorted(p.rglob("*.sql")) if p.is_dir() else [p])]


class Rows:
    """Random rows of a schema whose values collide: integers are mostly small (so keys
    join), and a column that the corpus compares with a literal takes that literal (or a
    date near it) half of the time (so filters match); one value in ten is NULL."""

    def __init__(self, seed: int, queries: list[Query]) -> None:
        self.random = random.Random(seed)
        self.literals: dict[str, list[str]] = {}
        for query in queries:
            for tree in _parsed(query.views):
                self._collect(tree)

    def _collect(self, tree: exp.Expression) -> None:
        """Each literal a column is compared with directly (``=``, ``<``, ``LIKE``, ``IN``, ``BETWEEN``)."""
        for node in tree.find_all(exp.Predicate):
            sides = [
                node.this,
                *(node.args.get(k) for k in ("expression", "low", "high")),
                *node.args.get("expressions", []),
            ]
            sides = [s.this if isinstance(s, exp.Cast) else s for s in sides if s is not None]
            columns = [s.name.lower() for s in sides if isinstance(s, exp.Column)]
            texts = [s.this for s in sides if isinstance(s, exp.Literal)]
            if isinstance(node, exp.Like):
                texts = [t.replace("%", "x").replace("_", "y") for t in texts]
            if columns and texts:
                self.literals.setdefault(columns[0], []).extend(texts)

    def row(self, schema: T.StructType) -> tuple:
        return tuple(None if self.random.random() < 0.1 else self.value(f) for f in schema.fields)

    def value(self, field: T.StructField):
        pick, kind = self.random, field.dataType
        literal = pick.choice(self.literals[field.name.lower()]) if field.name.lower() in self.literals else None
        literal = literal if pick.random() < 0.5 else None
        if isinstance(kind, (T.IntegerType, T.LongType)):
            return int(literal) if literal and literal.isdigit() else pick.randint(0, 4)
        if isinstance(kind, T.DecimalType):
            fits = [d for d in [literal or "", *DECIMALS] if _fits(d, kind)]
            return decimal.Decimal(fits[0] if literal in fits else pick.choice(fits))
        if isinstance(kind, T.DateType):
            day = _date(literal) or datetime.date(1995, 1, 1)
            return day + datetime.timedelta(days=pick.randint(-100, 100))
        if isinstance(kind, T.TimestampType):
            return datetime.datetime(2026, 11, 26, pick.choice([3, 9, 21])) + datetime.timedelta(
                seconds=pick.randint(0, 30)
            )
        return literal if literal is not None else pick.choice(["x", "y", "Google", "Apple"])


def _fits(text: str, kind: T.DecimalType) -> bool:
    """``text`` is a decimal number of at most ``kind``'s integer digits."""
    return re.fullmatch(r"\d+(\.\d+)?", text) is not None and len(text.split(".")[0]) <= kind.precision - kind.scale


DECIMALS = ["0.05", "0.06", "0.07", "0.10", "1.00", "23.00", "24.00", "1000.50"]


def _date(text: str | None) -> datetime.date | None:
    try:
        return datetime.date.fromisoformat(text) if text else None
    except ValueError:
        return None


def _parsed(views: str) -> list[exp.Expression]:
    """The views' parse trees that sqlglot can read (others add no literals)."""
    trees = []
    for statement in _statements(views):
        try:
            trees.append(sqlglot.parse_one(statement, read=DIALECT))
        except sqlglot.errors.ParseError:
            continue
    return trees


def steps_of(rows: Rows, schemas: dict[str, T.StructType], count: int, size: int) -> list[dict[str, list[tuple]]]:
    """``count`` steps: inserts of ``size`` rows a table (a row repeated now and then) and,
    after the first, deletes of about a third of the present rows."""
    present = {name: [] for name in schemas}
    steps = []
    for _ in range(count):
        step = {}
        for name, schema in schemas.items():
            inserts = [rows.row(schema) for _ in range(size)]
            inserts += rows.random.sample(inserts, size // 5)
            deletes = rows.random.sample(present[name], len(present[name]) // 3)
            for row in deletes:
                present[name].remove(row)
            present[name] += inserts
            step[name] = [(*r, 1) for r in inserts] + [(*r, -1) for r in deletes]
        steps.append(step)
    return steps


def file_steps(pick: random.Random, rows: dict[str, list[tuple]], count: int) -> list[dict[str, list[tuple]]]:
    """``count`` steps that insert each table's ``rows`` in a random order, split over the
    steps; each step but the last deletes about a third of the rows present, and the next
    step inserts them again, so the last step's integral is ``rows`` whole."""
    steps: list[dict[str, list[tuple]]] = [{} for _ in range(count)]
    for name, table in rows.items():
        table = pick.sample(table, len(table))
        present, deleted = [], []
        for t, step in enumerate(steps):
            inserts = table[t * len(table) // count : (t + 1) * len(table) // count] + deleted
            deleted = pick.sample(present, len(present) // 3) if t < count - 1 else []
            for row in deleted:
                present.remove(row)
            present += inserts
            step[name] = [(*r, 1) for r in inserts] + [(*r, -1) for r in deleted]
    return steps


def _views(text: str) -> list[tuple[str, bool, str]]:
    """Each view of a corpus query's views file (name, materialized, query text), in file
    order, read without the compiler's parser: the oracle runs whatever Spark accepts."""
    heads = [
        re.match(r"CREATE\s+(MATERIALIZED|TEMPORARY)\s+VIEW\s+(\w+)\s+AS\s+(.*)", s, re.DOTALL | re.IGNORECASE)
        for s in _statements(text)
    ]
    return [(m.group(2), m.group(1).upper() == "MATERIALIZED", m.group(3)) for m in heads]


def _add(into: Counter, rows: list[tuple]) -> None:
    """Adds weighted rows (the weight last) into a Z-set kept as a Counter."""
    for *row, weight in rows:
        into[tuple(row)] += weight


def _reason(error: Exception) -> str:
    """An error's cause without its location, cut to its first sentence: the key the summary counts by."""
    message = re.sub(r"^.*?, view '[^']*': ", "", str(error).strip().splitlines()[0])
    return re.sub(r"\s*SQLSTATE.*$", "", message.split("; ")[0])[:140]


class Runner:
    def __init__(self, spark, schemas: dict[str, str], workers: int) -> None:
        self.spark = spark
        self.schemas = {name: parse_schema(s) for name, s in schemas.items()}
        self.workers = workers

    def spark_fails(self, query: Query, steps: list[dict[str, list[tuple]]] = ()) -> str | None:
        """Spark batch SQL's own error on the query, if any: over empty tables (its
        analysis), then over the integrated inputs after each of ``steps``."""
        integrated = {name: Counter() for name in self.schemas}
        for step in [{}, *steps]:
            for name, rows in step.items():
                _add(integrated[name], rows)
            try:
                self.batch(query, integrated)
            except PySparkException as e:
                return _reason(e)
        return None

    def outcome(self, query: Query, steps: list[dict[str, list[tuple]]]) -> tuple[str, str]:
        try:
            circuit = compile_sql(query.views, self.schemas, self.spark, file=query.name)
        except SqlError as e:
            rejected = self.spark_fails(query)
            return ("not Spark SQL", rejected) if rejected else ("refused", _reason(e))
        except (PySparkException, DbspError) as e:  # what the compiler cannot build, it should refuse
            return "error", f"compiling: {type(e).__name__}: {_reason(e)}"
        try:
            return self.run(query, circuit, steps)
        except (PySparkException, DbspError) as e:
            failed = self.spark_fails(query, steps)  # Spark batch SQL fails the same data too
            return ("not Spark SQL", failed) if failed else ("error", f"{type(e).__name__}: {_reason(e)}")

    def run(self, query: Query, circuit, steps: list[dict[str, list[tuple]]]) -> tuple[str, str]:
        """``match`` (with the rows of the view at each step), or ``mismatch`` and where."""
        runner = StepRunner(circuit, self.spark, InMemoryStateStore(), workers=self.workers)
        sizes = []
        integrated = {name: Counter() for name in circuit.inputs}
        produced = {name: Counter() for name in circuit.outputs}
        for t, step in enumerate(steps):
            inputs = {n: from_rows(self.spark, step[n], circuit.inputs[n]) for n in circuit.inputs if step[n]}
            for name, rows in runner.step(inputs).collect_outputs().items():
                _add(produced[name], rows)
            for name in circuit.inputs:
                _add(integrated[name], step[name])
            for name, rows in self.batch(query, integrated).items():
                sizes.append(sum(rows.values()))
                got = Counter({row: w for row, w in produced[name].items() if w})
                if got != rows:
                    return "mismatch", (
                        f"step {t}, view {name}: missing {dict(rows - got)}, extra {dict(got - rows)}\n"
                        f"    the oracle ran: {self.oracle({n: s for n, _, s in _views(query.views)}[name])}"
                    )
        return "match", f"rows at each step {sizes}"

    def batch(self, query: Query, integrated: dict[str, Counter]) -> dict[str, Counter]:
        """Spark batch SQL of each materialized view's text over the integrated inputs."""
        self._tables({name: list(integrated.get(name, Counter()).elements()) for name in self.schemas})
        results = {}
        for name, materialized, select in _views(query.views):
            frame = self.spark.sql(self.oracle(select))
            frame.createOrReplaceTempView(name)
            if materialized:
                results[name] = Counter(tuple(r) for r in frame.collect())
        return results

    def oracle(self, select: str) -> str:
        """The text Spark batch SQL runs for a view's ``select``: with the engine's tie-break
        (printed at a mismatch, so that a report shows which oracle it was checked against)."""
        try:
            return tie_broken(select, len(self.spark.sql(select).columns))
        except sqlglot.errors.ParseError:
            return select  # not sqlglot's Spark SQL, so not compiled: it has no tie the engine breaks

    def _tables(self, rows: dict[str, list[tuple]]) -> None:
        for name, schema in self.schemas.items():
            self.spark.createDataFrame(rows[name], schema).createOrReplaceTempView(name)


def run_corpus(spark, title: str, corpus: list[Query], schemas: dict[str, str], args) -> Counter:
    """Runs the queries of ``corpus`` that ``--only`` names (all by default) over data drawn
    from the whole corpus's literals, so a query sees the same data either way."""
    queries = _selected(corpus, args)
    runner = Runner(spark, schemas, args.workers)
    rows = Rows(args.seed, corpus)
    steps = steps_of(rows, runner.schemas, args.steps, args.rows)
    print(
        f"== {title}: {len(queries)} queries, {args.steps} steps of {args.rows} (+{args.rows // 5} repeated) rows a table"
    )
    return run_queries(queries, lambda _: (runner, steps))


def _selected(corpus: list[Query], args) -> list[Query]:
    return [q for q in corpus if not args.only or q.name in args.only]


def run_spark_tests(spark, paths: list[Path], args) -> Counter:
    """Each of Spark's SQL test files: its queries run over its own inputs' rows, and its
    other statements counted as not a view, by kind."""
    total: Counter = Counter()
    for path in spark_test_files(paths):
        read = SparkTestFile(spark, path, re.sub(r"\W", "_", path.stem))
        print(f"== {path}: {sum(read.not_views.values()) + len(read.queries)} statements, {args.steps} steps")

        def setup(query: Query) -> tuple[Runner, list]:
            rows = {name: query.tables.rows[name] for name in query.tables.schemas}
            return Runner(spark, query.tables.schemas, args.workers), file_steps(
                random.Random(args.seed), rows, args.steps
            )

        counts = run_queries(_selected(read.queries, args), setup)
        counts.update({("not a view", kind): n for kind, n in read.not_views.items()})
        summary(counts, reasons=False)
        total += counts
    return total


def run_queries(queries: list[Query], setup) -> Counter:
    """Each query's outcome, printed and counted (by reason when not a match); ``setup``
    gives a query its runner and steps."""
    counts: Counter = Counter()
    for query in queries:
        runner, steps = setup(query)
        kind, detail = _kind(*runner.outcome(query, steps))
        counts[(kind, "" if kind in ("match", "mismatch") else detail)] += 1
        print(f"  {query.name:<14} {kind}{': ' + detail if detail else ''}", flush=True)
        if kind == "mismatch":
            print("    " + query.views.replace("\n", "\n    "))
    return counts


def _kind(kind: str, detail: str) -> tuple[str, str]:
    """A refusal for non-determinism is not a view (its value would differ between a step and its replay)."""
    return (
        ("not a view", "non-deterministic") if kind == "refused" and "non-deterministic" in detail else (kind, detail)
    )


def summary(counts: Counter, reasons: bool = True) -> None:
    by_kind = Counter()
    for (kind, _), n in counts.items():
        by_kind[kind] += n
    print(
        f"  -- statements {sum(by_kind.values())}: " + ", ".join(f"{kind} {n}" for kind, n in sorted(by_kind.items()))
    )
    for (kind, reason), n in sorted(counts.items(), key=lambda kv: (kv[0][0], -kv[1])):
        if reason and reasons:
            print(f"     {n:>3} {kind}: {reason}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tpch", type=Path, help="sqlglot's tests/fixtures/optimizer/tpc-h/tpc-h.sql")
    parser.add_argument(
        "--tpcds",
        type=Path,
        help="apache/spark's sql/core/src/test/resources/tpcds folder, or sqlglot's tests/fixtures/optimizer/tpc-ds/tpc-ds.sql",
    )
    parser.add_argument(
        "--nexmark", type=Path, help="the Nexmark repository's nexmark-flink/src/main/resources/queries"
    )
    parser.add_argument(
        "--spark-tests",
        type=Path,
        nargs="*",
        help="files or folders of apache/spark's sql/core/src/test/resources/sql-tests/inputs",
    )
    parser.add_argument("--only", nargs="*", help="run only these query names (e.g. tpch_q3 nexmark_q4)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=12, help="rows inserted per table per step")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=27)
    args = parser.parse_args()
    corpora = []
    if args.tpch:
        corpora.append(("TPC-H", tpch_queries(args.tpch), TPCH))
    if args.tpcds:
        corpora.append(("TPC-DS", tpcds_queries(args.tpcds), TPCDS))
    if args.nexmark:
        corpora.append(("Nexmark (Flink SQL)", nexmark_queries(args.nexmark), NEXMARK))
    if not corpora and not args.spark_tests:
        parser.error(
            "name a corpus: --tpch FILE, --tpcds PATH, --nexmark DIR and/or --spark-tests PATH... "
            "(see the module's docstring for where to get them)"
        )
    # Spark's own tests include queries Spark rejects: their errors are counted, not logged
    PySparkLogger.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)
    spark = local_session(2)
    for title, queries, schemas in corpora:
        summary(run_corpus(spark, title, queries, schemas, args))
    if args.spark_tests:
        print("== Spark's SQL tests, in total")
        summary(run_spark_tests(spark, args.spark_tests, args))


if __name__ == "__main__":
    main()
