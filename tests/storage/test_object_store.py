"""The S3-compatible server the object-store tests run on, checked where Delta's commits
depend on it: a commit on S3 is a conditional put of the version's log file, so of two
committers of one version exactly one may win, and the loser must be told."""

import threading

import pyarrow as pa
import pytest
from botocore.exceptions import ClientError
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

ROUNDS = 10


@pytest.fixture
def bucket(s3) -> str:
    return s3.bucket()


def at_once(count: int, action) -> list:
    """``action(i)`` in ``count`` threads released together; each one's result or exception."""
    barrier, results = threading.Barrier(count), [None] * count

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = action(i)
        except Exception as e:  # the loser's answer is the point
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_of_two_puts_of_one_new_key_exactly_one_wins_and_a_stale_etag_is_refused(s3, bucket):
    client = s3.client()
    for round_ in range(ROUNDS):
        key = f"_delta_log/{round_:020d}.json"
        results = at_once(
            2, lambda i, key=key: client.put_object(Bucket=bucket, Key=key, Body=f"{i}".encode(), IfNoneMatch="*")
        )
        refused = [r for r in results if isinstance(r, ClientError)]
        assert len(refused) == 1 and refused[0].response["Error"]["Code"] == "PreconditionFailed", results
    first = client.put_object(Bucket=bucket, Key="cursor", Body=b"1")["ETag"]
    client.put_object(Bucket=bucket, Key="cursor", Body=b"2", IfMatch=first)
    with pytest.raises(ClientError, match="PreconditionFailed"):
        client.put_object(Bucket=bucket, Key="cursor", Body=b"3", IfMatch=first)


def test_of_two_delta_committers_of_one_version_exactly_one_commits_and_nothing_is_lost(s3, bucket):
    uri, options = f"s3://{bucket}/table", s3.delta_options()
    write_deltalake(uri, pa.table({"writer": pa.array([], pa.int64())}), storage_options=options)
    winners = []
    for round_ in range(ROUNDS):
        # Both read the same version, then both commit the next one, without retrying.
        tables = [DeltaTable(uri, storage_options=options) for _ in range(2)]
        results = at_once(
            2,
            lambda i, tables=tables, round_=round_: write_deltalake(
                tables[i],
                pa.table({"writer": [round_ * 2 + i]}),
                mode="append",
                commit_properties=CommitProperties(max_commit_retries=0),
            ),
        )
        won = [round_ * 2 + i for i, r in enumerate(results) if not isinstance(r, Exception)]
        assert len(won) == 1, results
        assert all(isinstance(r, CommitFailedError) for r in results if isinstance(r, Exception)), results
        winners += won
    table = DeltaTable(uri, storage_options=options)
    assert table.version() == ROUNDS
    assert sorted(table.to_pyarrow_table()["writer"].to_pylist()) == winners
