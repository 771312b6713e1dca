"""The demo producer's rate into a fresh embedded broker, for an A/B of two checkouts.

Sends ``--records`` Nexmark bids (JSON, as ``dbsp demo`` produces them) to a topic of
``--partitions`` partitions of a fresh ``LocalBroker`` by the demo's producer path, and
prints records acknowledged per second.  It runs in any checkout of the project, old or
new: where the checkout's broker needs one record per batch (``local_producer_config``) it
uses that and the demo's parallel producers, as that checkout's demo does.

Run each side back to back with its own interpreter::

    PYTHONPATH=A A/.venv/bin/python bench/producer_rate.py
    PYTHONPATH=B B/.venv/bin/python bench/producer_rate.py
"""

from __future__ import annotations

import argparse
import json
import time

import sensors.broker as broker
from sensors.kafka import KafkaClient


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    values = [
        json.dumps({"auction": 1000 + i, "bidder": i % 977, "price": i % 5000, "channel": "c", "date_time": i}).encode()
        for i in range(args.records)
    ]
    with broker.LocalBroker() as local:
        broker.ensure_topics(local.bootstrap, {"rate": args.partitions})
        one_per_batch = getattr(broker, "local_producer_config", None)
        started = time.perf_counter()
        if one_per_batch:
            sent = KafkaClient(local.bootstrap, one_per_batch(), timeout=30).produce_parallel("rate", values, 4)
        else:
            sent = KafkaClient(local.bootstrap, timeout=30).produce("rate", values)
        seconds = time.perf_counter() - started
    kind = "one record per batch, 4 producers" if one_per_batch else "one producer"
    print(f"{sent:,} records in {seconds:.2f} s ({kind}): {sent / seconds:,.0f} records/s")


if __name__ == "__main__":
    main()
