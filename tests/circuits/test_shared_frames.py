"""A step's shared frames (:meth:`circuits.context.StepContext.share`) are computed when they
are shared, not by the first job that reads them: the step's planners run jobs over one
shared frame at once, and Spark's scheduler deadlocks when one of them marks a lazily
checkpointed frame checkpointed while another is submitted (``bench/checkpoint_deadlock.py``
reproduces it)."""

import uuid

from circuits.context import StepContext


def test_a_shared_frame_is_computed_once_when_shared(spark, tmp_path):
    computed = tmp_path / "computed"
    computed.mkdir()

    def mark(batches):
        for batch in batches:
            (computed / uuid.uuid4().hex).touch()  # the Python worker runs beside the server
            yield batch

    frame = spark.range(0, 5, 1, 1).mapInArrow(mark, "id long")
    step = StepContext(spark, store=None, layout=None, inputs={})
    shared = step.share(frame, empty=False)
    assert len(list(computed.iterdir())) == 1  # before any job reads it
    assert sorted(r.id for r in shared.union(shared).collect()) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert len(list(computed.iterdir())) == 1  # its readers read the checkpoint
