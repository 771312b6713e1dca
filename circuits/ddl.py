"""Spark DDL schemas parsed without Spark: ``'id BIGINT, price DECIMAL(10,2), at TIMESTAMP'``.

Circuits and configurations are built before a Spark session exists (a code server, a CLI
process), and a round trip per schema would cost; so the types below are parsed here.  A
schema with anything else (``NOT NULL``, ``COMMENT``, an interval) is left to Spark's parser.

Types: the primitive names below, ``decimal``/``dec``/``numeric`` with an optional
``(precision[, scale])`` (``decimal(10,0)`` without), ``array<T>``, ``map<K, V>`` and
``struct<name: T, ...>`` (the colon optional), case-insensitive; a name may be quoted with
backticks.
"""

from __future__ import annotations

import re

from pyspark.sql import types as T

from .sql.parse import ddl_fields

PRIMITIVES: dict[str, T.DataType] = {
    **{name: T.LongType() for name in ("bigint", "long")},
    **{name: T.IntegerType() for name in ("int", "integer")},
    **{name: T.ShortType() for name in ("smallint", "short")},
    **{name: T.ByteType() for name in ("tinyint", "byte")},
    **{name: T.DoubleType() for name in ("double", "float64")},
    **{name: T.FloatType() for name in ("float", "real")},
    "string": T.StringType(),
    "boolean": T.BooleanType(),
    "binary": T.BinaryType(),
    "date": T.DateType(),
    **{name: T.TimestampType() for name in ("timestamp", "timestamp_ltz")},
    "timestamp_ntz": T.TimestampNTZType(),
}
_DECIMALS = ("decimal", "dec", "numeric")
_TOKEN = re.compile(r"\s*(`[^`]*`|\w+|[<>(),:])")


class _Unparsed(Exception):
    """Text outside the types parsed here."""


class _Tokens:
    def __init__(self, text: str) -> None:
        self.tokens, end = [], 0
        for match in _TOKEN.finditer(text):
            if match.start() != end:
                raise _Unparsed(text)
            self.tokens.append(match.group(1))
            end = match.end()
        if text[end:].strip():
            raise _Unparsed(text)
        self.at = 0

    def next(self) -> str:
        if self.at == len(self.tokens):
            raise _Unparsed("end")
        self.at += 1
        return self.tokens[self.at - 1]

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def expect(self, token: str) -> None:
        if self.next() != token:
            raise _Unparsed(token)

    def name(self) -> str:
        word = self.next()
        if word in "<>(),:":
            raise _Unparsed(word)
        return word[1:-1] if word.startswith("`") else word

    def type(self) -> T.DataType:
        word = self.next().lower()
        if word in PRIMITIVES:
            return PRIMITIVES[word]
        if word in _DECIMALS:
            return self._decimal()
        if word == "array":
            self.expect("<")
            element = self.type()
            self.expect(">")
            return T.ArrayType(element)
        if word == "map":
            self.expect("<")
            key = self.type()
            self.expect(",")
            value = self.type()
            self.expect(">")
            return T.MapType(key, value)
        if word == "struct":
            self.expect("<")
            fields = [] if self.peek() == ">" else self._fields(">")
            self.expect(">")
            return T.StructType(fields)
        raise _Unparsed(word)

    def _decimal(self) -> T.DecimalType:
        if self.peek() != "(":
            return T.DecimalType(10, 0)
        self.expect("(")
        numbers = [int(self.next())]
        if self.peek() == ",":
            self.expect(",")
            numbers.append(int(self.next()))
        self.expect(")")
        return T.DecimalType(*numbers)

    def _fields(self, end: str) -> list[T.StructField]:
        fields = []
        while True:
            name = self.name()
            if self.peek() == ":":
                self.next()
            fields.append(T.StructField(name, self.type()))
            if self.peek() != ",":
                return fields
            self.next()


def parse_type(text: str) -> T.DataType | None:
    """The type ``text`` names (``'decimal(10,2)'``, ``'array<struct<a:int>>'``), or None
    when it is not one of the types parsed here."""
    try:
        tokens = _Tokens(text)
        parsed = tokens.type()
        return parsed if tokens.peek() is None else None
    except (_Unparsed, ValueError):
        return None


def parse_ddl(ddl: str) -> T.StructType | None:
    """The schema ``ddl`` declares, or None when it has text outside what is parsed here."""
    fields = []
    for field in ddl_fields(ddl):
        try:
            tokens = _Tokens(field)
            name = tokens.name()
            if tokens.peek() == ":":
                tokens.next()
            fields.append(T.StructField(name, tokens.type()))
            if tokens.peek() is not None:
                return None
        except (_Unparsed, ValueError):
            return None
    return T.StructType(fields)
