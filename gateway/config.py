"""The gateway's settings: ``gateway:`` and ``sources:`` in ``dbsp.yaml``, validated here.

Each source group names the Kafka topic its bytes go to (an input topic of a pipeline);
what the bytes mean is the pipeline's business (newline-delimited JSON records by default).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Group(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="the group's name, the prefix of its sources' ids")
    topic: str = Field(description="the Kafka topic the group's bytes go to (a pipeline's input topic)")


class FilesSpec(_Group):
    """Tails every file of a directory whose name matches ``pattern``, new files included."""

    kind: Literal["files"]
    directory: str = Field(description="the landing directory")
    pattern: str = Field("*", description="a glob the file names must match")
    poll_interval: float = Field(
        0.05, gt=0, description="seconds between scans of the directory for new and grown files"
    )


class TcpSpec(_Group):
    """Listens on ``host:port``; each connection is a source of newline-delimited records."""

    kind: Literal["tcp"]
    host: str = Field("127.0.0.1", description="the address to listen on (0.0.0.0 for every interface)")
    port: int = Field(ge=0, lt=65536, description="the port to listen on")


class HttpSpec(_Group):
    """Polls ``url`` every ``interval`` seconds; each response body is the next bytes."""

    kind: Literal["http"]
    url: str = Field(description="http://host[:port]/path to GET")
    interval: float = Field(1.0, gt=0, description="seconds between polls")


class GeneratorSpec(_Group):
    """Synthetic sources (tests, benchmarks, demos): ``count`` sources writing ``lines`` each."""

    kind: Literal["generator"]
    count: int = Field(1, gt=0, description="how many sources")
    lines: int = Field(1000, ge=0, description="lines each source writes before its end")
    rate: float | None = Field(None, gt=0, description="lines per second per source (unlimited when absent)")


SourceSpec = Annotated[FilesSpec | TcpSpec | HttpSpec | GeneratorSpec, Field(discriminator="kind")]


class GatewaySpec(BaseModel):
    """The gateway process: its I/O buffer pool, threads and control endpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    buffers: int = Field(2048, gt=1, description="I/O buffers in the pool; more than the sources there will be")
    buffer_size: int = Field(16384, ge=64, description="bytes per buffer; above the longest record")
    io_threads: int = Field(1, gt=0, description="I/O threads, each running one asyncio event loop")
    control_host: str = Field("127.0.0.1", description="address of the control endpoint (flush, status)")
    control_port: int = Field(0, ge=0, lt=65536, description="port of the control endpoint (0: any free one)")
    cursors: str = Field(
        "",
        description="the Delta table of the cursors (default <DBSP_HOME>/gateway/cursors, or <store root>/_gateway_cursors on S3)",
    )
    cursor_commit_seconds: float = Field(
        1.0, gt=0, description="most seconds between two commits of the cursors while the broker acknowledges bytes"
    )
    cursor_commit_bytes: int = Field(
        4 << 20,
        gt=0,
        description="acknowledged bytes after which the cursors are "
        "committed without waiting for cursor_commit_seconds",
    )
