"""Delta tables without Spark: create, open and read one with delta-rs and pyarrow.

What a process that must not load PySpark needs (the gateway's cursor table is one:
:mod:`storage.cursors`); the tables Spark writes are in :mod:`storage.delta`.
"""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from . import location
from .errors import CorruptTableError, StorageError

TABLE_CONFIG = {
    # Every step commits to a dozen tables and opens each several times; without a Delta
    # checkpoint an open replays every commit's JSON (15-20 ms at 60 versions, growing to
    # the default interval of 100), with one every 10 commits it reads a few (3-5 ms).
    "delta.checkpointInterval": "10",
    # A checkpoint would otherwise delete commit files older than 30 days, and with them
    # time travel to the versions a retained pipeline checkpoint pins; vacuum decides.
    "delta.enableExpiredLogCleanup": "false",
}
"""The configuration of every table the engine creates."""


def ensure_table(uri: str, schema: pa.Schema) -> DeltaTable:
    for _ in range(50):
        try:
            return DeltaTable(uri, storage_options=location.delta_options(uri))
        except TableNotFoundError:
            location.makedirs(uri)
            try:
                return DeltaTable.create(
                    uri,
                    schema,
                    mode="ignore",
                    configuration=TABLE_CONFIG,
                    storage_options=location.delta_options(uri),
                )
            except (CommitFailedError, OSError):
                time.sleep(0.01)  # another writer is creating it at this moment: open theirs
    raise StorageError(f"cannot create or open the Delta table {uri}")


def open_table(uri: str, version: int | None = None) -> DeltaTable | None:
    """The table at ``version`` (latest when None), or None when it does not exist."""
    try:
        return DeltaTable(uri, version=version, storage_options=location.delta_options(uri))
    except TableNotFoundError:
        return None
    except (DeltaError, OSError) as e:
        raise CorruptTableError(f"Delta table {uri} (version {version}): {e}") from e


def dataset(table: DeltaTable, pruning: list[tuple] | None = None) -> ds.Dataset:
    """The rows of ``table``'s version (of its files that ``pruning``'s filters admit by
    their statistics, see ``DeltaTable.file_uris``), read with pyarrow's own file system.
    Reading through delta-rs's (``to_pyarrow_table``, ``to_pyarrow_dataset``) left
    processes aborting at exit ("terminate called without an active exception", exit
    code 134; deltalake 1.6, pyarrow 26): 1 to 6 of every 8-10 runs, by the script."""
    files = table.file_uris(file_pruning_predicate=pruning)
    if not files:
        return ds.dataset(pa.schema(table.schema().to_arrow()).empty_table())
    return parquet_dataset(files)


def parquet_dataset(files: list[str], schema: pa.Schema | None = None) -> ds.Dataset:
    """The Parquet files ``files`` (URIs of one store) as one dataset."""
    fs = location.filesystem(files[0])[0]
    return ds.dataset([location.filesystem(f)[1] for f in files], schema=schema, format="parquet", filesystem=fs)


def groupable(table: DeltaTable) -> bool:
    """Whether pyarrow can group ``table``'s rows by all their columns: it has no nested
    column (pyarrow's hash grouping takes none)."""
    return not any(pa.types.is_nested(f.type) for f in pa.schema(table.schema().to_arrow()))
