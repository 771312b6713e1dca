"""Errors of the source gateway, rooted in :class:`circuits.errors.DbspError`.

Settings are named as in ``dbsp.yaml``: ``gateway.buffers``, ``gateway.buffer_size``,
``gateway.io_threads``, and per source ``sources[i].<field>``.
"""

from __future__ import annotations

from circuits.errors import DbspError


class GatewayError(DbspError):
    """The gateway or one of its parts was used against its rules."""


class GatewayBrokerError(GatewayError):
    """The broker did not answer the gateway (or lacks a topic it writes) in time."""


class GatewayConfigError(GatewayError):
    """A gateway setting cannot work; the message names the setting and the fix."""


class SourceFailed(GatewayError):
    """A source could not open or read; the executor reports it and retries with backoff.

    ``source_id`` names the source, ``reason`` says what happened in words a user can act on.
    """

    def __init__(self, source_id: str, reason: str):
        super().__init__(f"source {source_id!r}: {reason}")
        self.source_id = source_id
        self.reason = reason


class SourceGone(SourceFailed):
    """The source's data is gone for good (a tailed file was deleted): the executor reports
    it, delivers what was read and ends the source without retrying."""
