"""Delta tables through delta-rs, without Spark."""

from __future__ import annotations

import shutil

import pyarrow as pa
from deltalake import CommitProperties, Transaction, write_deltalake

from storage.delta import WrittenFiles, commit, transaction_version

SCHEMA = pa.schema([("a", pa.int64())])


def test_a_kept_handle_sees_every_writers_commits_and_a_table_made_anew_is_another(tmp_path):
    uri = str(tmp_path / "t")
    assert transaction_version(uri, "x") is None
    commit(WrittenFiles(uri, SCHEMA, []), "x", 0)  # creates the table
    assert transaction_version(uri, "x") == 0
    # Another writer, with a handle of its own (another process would do the same).
    write_deltalake(
        uri,
        pa.table({"a": [1]}),
        mode="append",
        commit_properties=CommitProperties(app_transactions=[Transaction("x", 1)]),
    )
    assert transaction_version(uri, "x") == 1
    assert commit(WrittenFiles(uri, SCHEMA, []), "x", 2) == 3  # on top of the other writer's version
    shutil.rmtree(uri)
    assert transaction_version(uri, "x") is None
    commit(WrittenFiles(uri, SCHEMA, []), "y", 5)
    assert (transaction_version(uri, "x"), transaction_version(uri, "y")) == (None, 5)
