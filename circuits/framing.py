"""The framing of the source gateway's messages on Kafka: the one format the gateway (which
writes it) and the step's decoder (:mod:`sensors.decode`, which reads it) share.

A gateway message holds a source's raw bytes, whole newline-delimited records, with the
source id as key and the bytes' range in header :data:`RANGE_HEADER`; a piece of a record
longer than the gateway's buffer carries :data:`PARTIAL_HEADER` as well.  Both sides' clients
start from :func:`client_config`.  No Spark here.
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
    return framed_range(message.headers())


def framed_range(headers: list[tuple[str, bytes]] | None) -> tuple[int, int, bool] | None:
    """:func:`gateway_range` of a message's ``headers`` (key, value pairs)."""
    headers = dict(headers or ())
    if RANGE_HEADER not in headers:
        return None
    start, _, end = headers[RANGE_HEADER].decode().partition("-")
    return int(start), int(end), PARTIAL_HEADER in headers


def client_config(bootstrap_servers: str, config: dict | None = None) -> dict:
    """librdkafka settings for any client: the bootstrap servers, then the user's ``config``."""
    # librdkafka logs every failed connection attempt to stderr, which floods the logs while
    # a broker is down; the failure reaches the user as an error of the caller instead.
    return {"bootstrap.servers": bootstrap_servers, "log_level": 0, **(config or {})}


def consumer_config(bootstrap_servers: str, config: dict | None = None) -> dict:
    """Settings for a consumer that reads explicitly assigned offsets and never commits."""
    return {
        **client_config(bootstrap_servers, {"group.id": "dbsp-reader", **(config or {})}),
        "enable.auto.commit": False,
        # Offsets that are gone must fail the read, never silently jump to other offsets.
        "auto.offset.reset": "error",
        # Records of an aborted transaction never enter a step (librdkafka's default, stated).
        "isolation.level": "read_committed",
    }


def no_broker(bootstrap_servers: str, timeout: float, cause: str) -> str:
    """What a client says when no broker answered it: the cause seen and the setting to check."""
    return (
        f"no Kafka broker at bootstrap servers {bootstrap_servers!r} answered within {timeout:g} s ({cause}): "
        "check the bootstrap servers setting (bootstrap.servers) and that the broker is running"
    )
