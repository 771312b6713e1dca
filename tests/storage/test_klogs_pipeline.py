"""A KLogs pipeline on the Delta state database: its sink gets, per key, what a sequential
fold gives, across restarts (a new process's view: new Pipeline objects) and a rescale;
the sink's Delta table holds each message once."""

import json
from collections import defaultdict

from deltalake import DeltaTable

from circuits.klogs import RECORD_SCHEMA, KLog, deploy
from circuits.zset import from_rows
from storage.logs import Range
from storage.pipeline import Pipeline
from storage.sinks import DeltaSink

LOG = "counts"
# (key, value) messages, four steps; one partition, offsets count up.
STEPS = [[("a", 1), ("b", 2), ("a", 3)], [("b", 4)], [("c", 5), ("a", 6), ("c", 7)], [("b", 8), ("a", 9)]]


def add(total, _key, value):
    return total + value, [total + value]


def circuit(uri: str):
    def pipeline():
        KLog.named(LOG).loop(0, add).sink(DeltaSink(uri))

    return deploy(pipeline, "klogs_sums", vnodes=16)


def test_sums_across_restarts_and_a_rescale_are_each_written_once(spark, tmp_path):
    root, uri = str(tmp_path / "pipeline"), str(tmp_path / "sums")
    offset = 0
    for step, messages in enumerate(STEPS):
        pipeline = Pipeline(spark, root, circuit(uri), workers=2)  # a restart before every step
        rows = [(json.dumps(k), json.dumps(v), 0, offset + i, None, 1) for i, (k, v) in enumerate(messages)]
        pipeline.submit(step, {LOG: from_rows(spark, rows, RECORD_SCHEMA)}, [Range(LOG, 0, offset, offset + len(rows))])
        offset += len(rows)
        pipeline.run()
        if step == 1:
            pipeline.rescale(3)
    expected, totals = defaultdict(list), defaultdict(int)
    for messages in STEPS:
        for key, value in messages:
            totals[key] += value
            expected[key].append(totals[key])
    got = defaultdict(list)
    for row in sorted(DeltaTable(uri).to_pyarrow_table().to_pylist(), key=lambda r: [int(o) for o in r["offset"].split(".")]):
        got[json.loads(row["key"])].append(json.loads(row["value"]))
    assert got == expected
