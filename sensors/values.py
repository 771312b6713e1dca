"""The JSON forms of the input column types: which values a column of each type takes,
and the form the record is handed to Spark in.

A record's JSON is parsed with its numbers kept as written (``decimal.Decimal``, never a
float), so a ``DECIMAL`` is exact.  A record with a column whose JSON form is not Spark's
(dates, timestamps, decimals, and the containers holding them) is written again in
Spark's form: a timestamp as ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` in UTC, a decimal as the
number with exactly its scale's digits.

==================  ==================================================================
type                JSON values (``null`` is every type's)
==================  ==================================================================
tinyint .. bigint   an integer number in the type's range
double, float       a number
decimal(p,s)        a number or a string of one, with at most ``s`` digits after the
                    point and ``p - s`` before it (``1.5``, ``"1.50"``, ``2e3``)
string              a string
boolean             ``true``, ``false``
date                an ISO-8601 date string, ``"2024-03-01"``
timestamp           an ISO-8601 string with a UTC offset (``"2024-03-01T12:30:00Z"``,
                    ``"2024-03-01 12:30:00.5+01:00"``) or without one (then UTC, the
                    session time zone); or a number: seconds since 1970-01-01T00:00:00Z
timestamp_ntz       an ISO-8601 string without an offset, ``"2024-03-01T12:30:00"``
array<T>            a JSON array of T
struct<a: T, ...>   a JSON object holding every field (other keys ignored)
==================  ==================================================================

Timestamps hold microseconds (at most six digits after the second) and years 1 to 9999.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal, InvalidOperation, localcontext
from functools import cache
from json.encoder import encode_basestring_ascii as _string

from pyspark.sql import types as T

from circuits.ddl import parse_type

SUPPORTED = (
    "tinyint, smallint, int, bigint, double, float, decimal(p,s), string, boolean, date, timestamp, "
    "timestamp_ntz, array<T>, struct<name: T, ...>"
)
"""The column types JSON input carries, as the error refusing another one lists them."""

_INTEGERS = {T.LongType: 64, T.IntegerType: 32, T.ShortType: 16, T.ByteType: 8}
_PLAIN = (*_INTEGERS, T.DoubleType, T.FloatType, T.StringType, T.BooleanType)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Mismatch(ValueError):
    """A JSON value that is not of its column's type: ``detail`` says why, when more than
    its kind does."""

    def __init__(self, value: object, detail: str = "") -> None:
        super().__init__(detail)
        self.value, self.detail = value, detail


def unsupported(kind: T.DataType) -> str | None:
    """Why JSON input cannot carry a column of type ``kind``, or None when it can."""
    if isinstance(kind, T.ArrayType):
        return unsupported(kind.elementType)
    if isinstance(kind, T.MapType):
        return (
            "a Z-set's rows are compared and grouped, and Spark can do neither with a map: declare the keys "
            "as struct<key1: T, ...>, or the entries as array<struct<key: string, value: T>>"
        )
    if isinstance(kind, T.StructType):
        return next((u for u in (unsupported(f.dataType) for f in kind.fields) if u), None)
    supported = (*_PLAIN, T.DecimalType, T.DateType, T.TimestampType, T.TimestampNTZType)
    return None if isinstance(kind, supported) else f"{kind.simpleString()} has no JSON form here"


def plain(kind: T.DataType) -> bool:
    """Whether a column of ``kind`` is handed to Spark in the JSON it came in."""
    return isinstance(kind, _PLAIN)


def _number(value: object) -> bool:
    return isinstance(value, (int, float, Decimal)) and not isinstance(value, bool)


def _integer(bits: int, name: str) -> Callable[[object], object]:
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    def check(value: object) -> object:
        # bool is an int in Python, but JSON true is no number.
        if not isinstance(value, int) or isinstance(value, bool):
            raise Mismatch(value)
        if not low <= value <= high:
            raise Mismatch(value, f"{value} (out of {name} range)")
        return value

    return check


def _of(kind: type, value: object) -> object:
    if not isinstance(value, kind):
        raise Mismatch(value)
    return value


def _double(value: object) -> object:
    if not _number(value):
        raise Mismatch(value)
    return value


def _decimal(precision: int, scale: int) -> Callable[[object], object]:
    step = Decimal(1).scaleb(-scale)

    def check(value: object) -> Decimal:
        if isinstance(value, str):
            try:
                number = Decimal(value.strip())
            except InvalidOperation:
                raise Mismatch(value, f"{value!r} (not a number)") from None
        elif _number(value):
            number = Decimal(value) if isinstance(value, int) else value
        else:
            raise Mismatch(value)
        if not number.is_finite():
            raise Mismatch(value, f"{value!r} (not a finite number)")
        # Decimal arithmetic rounds to its context's 28 digits: the checks compare exponents,
        # and the quantize has the digits the type's precision needs.
        if number and number.adjusted() >= precision - scale:
            raise Mismatch(value, f"{value} (more than {precision - scale} digits before the point)")
        with localcontext() as exact:
            exact.prec = precision + 1
            fixed = number.quantize(step)
        if fixed != number:
            raise Mismatch(value, f"{value} (more than {scale} digits after the point)")
        return fixed

    return check


def _iso(value: object, parse: Callable[[str], object]) -> object:
    if not isinstance(value, str):
        raise Mismatch(value)
    try:
        return parse(value)
    except (ValueError, OverflowError) as error:
        raise Mismatch(value, f"{value!r} ({error})") from None


def _micros(text: str) -> None:
    """Refuses more than six digits of a second (Spark keeps microseconds)."""
    fraction = text.partition(".")[2]
    digits = len(fraction) - len(fraction.lstrip("0123456789"))
    if digits > 6:
        raise ValueError("more than 6 digits after the second")


def _date(value: object) -> str:
    return _iso(value, lambda text: date.fromisoformat(text).isoformat())


def _instant(text: str) -> datetime:
    _micros(text)
    moment = datetime.fromisoformat(text)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC)


def _timestamp(value: object) -> str:
    if _number(value):
        # Exponents first: Decimal arithmetic overflows (1e999999999) or rounds to 0 (1e-999999999).
        number = Decimal(value)
        outside = Mismatch(value, f"{value} seconds (outside the years 1 to 9999)")
        if number.adjusted() > 12:
            raise outside
        micros = number.scaleb(6)
        if (number and number.adjusted() < -6) or micros != micros.to_integral_value():
            raise Mismatch(value, f"{value} seconds (finer than a microsecond)")
        try:
            moment = _EPOCH + timedelta(microseconds=int(micros))
        except OverflowError:
            raise outside from None
    else:
        moment = _iso(value, _instant)
    return moment.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def _local(text: str) -> str:
    _micros(text)
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is not None:
        raise ValueError("a timestamp_ntz has no UTC offset: drop it, or declare the column timestamp")
    return moment.isoformat(timespec="microseconds")


def _array(element: Callable[[object], object]) -> Callable[[object], object]:
    def check(value: object) -> list:
        if not isinstance(value, list):
            raise Mismatch(value)
        return [None if v is None else element(v) for v in value]

    return check


def _struct(fields: list[tuple[str, Callable[[object], object]]]) -> Callable[[object], object]:
    def check(value: object) -> dict:
        if not isinstance(value, dict):
            raise Mismatch(value)
        missing = [name for name, _ in fields if name not in value]
        if missing:
            raise Mismatch(value, f"an object without field {missing[0]!r}")
        return {name: None if value[name] is None else field(value[name]) for name, field in fields}

    return check


def _checker(kind: T.DataType) -> Callable[[object], object]:
    """The function from a non-null JSON value of a ``kind`` column to its form for Spark;
    raises :class:`Mismatch` for a value of another type."""
    for integer, bits in _INTEGERS.items():
        if isinstance(kind, integer):
            return _integer(bits, kind.simpleString())
    simple = {
        T.DoubleType: _double,
        T.FloatType: _double,
        T.StringType: lambda v: _of(str, v),
        T.BooleanType: lambda v: _of(bool, v),
        T.DateType: _date,
        T.TimestampType: _timestamp,
        T.TimestampNTZType: lambda v: _iso(v, _local),
    }
    if type(kind) in simple:
        return simple[type(kind)]
    if isinstance(kind, T.DecimalType):
        return _decimal(kind.precision, kind.scale)
    if isinstance(kind, T.ArrayType):
        return _array(_checker(kind.elementType))
    if isinstance(kind, T.StructType):
        return _struct([(f.name, _checker(f.dataType)) for f in kind.fields])
    raise ValueError(unsupported(kind))


@cache
def checker(type_name: str) -> Callable[[object], object]:
    """:func:`_checker` of the type ``type_name`` names (its ``simpleString``)."""
    return _checker(parse_type(type_name))


def kind_of(value: object) -> str:
    """The name of ``value``'s JSON kind, as a reason says it: a number with a point or an
    exponent is a float."""
    return "float" if isinstance(value, Decimal) else type(value).__name__


_CONSTANTS = {None: "null", True: "true", False: "false"}


def dumps(value: object) -> str:
    """``value`` (parsed JSON, numbers as ``Decimal``) as JSON text, numbers as written.
    Strings go through the json module's C encoder: ``json.dumps`` per value cost half a
    typed record's decoding."""
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{_string(k)}:{dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(map(dumps, value)) + "]"
    if value is None or isinstance(value, bool):
        return _CONSTANTS[value]
    return float.__repr__(value) if isinstance(value, float) else str(value)
