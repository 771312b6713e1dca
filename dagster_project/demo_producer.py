"""The demo producer: a configured ``producer`` function's events sent to a pipeline's
topics, for ``dbsp demo`` and the ``<pipeline>_produce`` Dagster job."""

import json

from sensors.ingest import KafkaSource


def produce_events(source: KafkaSource, records_of, events: int, seed: int) -> int:
    """Sends the next ``events`` events of a demo producer to the source's topics and
    returns the index of the first.  The sequence continues from the number of records
    already in the topics, so producing twice never repeats an event."""
    client = source.client()
    start = sum(high for _, high in client.offsets(list(source.topics.values())).values())
    for handle, records in records_of(start, events, seed).items():
        client.produce(source.topics[handle], (json.dumps(r).encode() for r in records))
    return start
