"""The framing of the source gateway's messages on Kafka: the one format the gateway (which
writes it) and the step's decoder (:mod:`sensors.decode`, which reads it) share.

A gateway message holds a source's raw bytes, whole newline-delimited records, with the
source id as key and the bytes' range in header :data:`RANGE_HEADER`; a piece of a record
longer than the gateway's buffer carries :data:`PARTIAL_HEADER` as well.  No Spark here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from confluent_kafka import Message

RANGE_HEADER = "dbsp-bytes"
"""The header of a gateway message: ``"<start>-<end>"``, its bytes' range in its source."""
PARTIAL_HEADER = "dbsp-partial"
"""The header of a gateway message holding a piece of a record longer than a buffer."""


def range_headers(start: int, end: int, partial: bool) -> list[tuple[str, bytes]]:
    """The headers of a gateway message of bytes ``start..end`` of its source."""
    return [(RANGE_HEADER, f"{start}-{end}".encode())] + ([(PARTIAL_HEADER, b"1")] if partial else [])


def gateway_range(message: Message) -> tuple[int, int, bool] | None:
    """``(start, end, partial)`` of a gateway message, or None for a message that is one record."""
    headers = dict(message.headers() or ())
    if RANGE_HEADER not in headers:
        return None
    start, _, end = headers[RANGE_HEADER].decode().partition("-")
    return int(start), int(end), PARTIAL_HEADER in headers
