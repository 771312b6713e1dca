from collections import Counter

from circuits.library import NexmarkGenerator


def test_events_are_deterministic_and_independent_of_chunking():
    g = NexmarkGenerator(seed=3)
    whole = list(g.events(0, 500))
    chunked = list(g.events(0, 123)) + list(g.events(123, 377))
    assert whole == chunked == list(NexmarkGenerator(seed=3).events(0, 500))
    assert whole != list(NexmarkGenerator(seed=4).events(0, 500))


def test_proportion_is_one_person_three_auctions_forty_six_bids():
    kinds = Counter(kind for kind, _ in NexmarkGenerator(seed=1).events(0, 5000))
    assert kinds == Counter({"persons": 100, "auctions": 300, "bids": 4600})


def test_bids_refer_to_existing_auctions_and_people():
    events = list(NexmarkGenerator(seed=2).events(0, 2000))
    auctions = {row[0] for kind, row in events if kind == "auctions"}
    persons = {row[0] for kind, row in events if kind == "persons"}
    bids = [row for kind, row in events if kind == "bids"]
    assert all(b[0] in auctions and b[1] in persons for b in bids)


def test_a_delta_batch_inserts_its_events_and_changes_only_earlier_rows_once_each():
    from circuits.library.nexmark import COLUMNS, DELETE, KEYS, PROPORTION, UPSERT, nexmark_changes

    generator = NexmarkGenerator(seed=5)
    start, count = 3000, 1000
    batch = nexmark_changes(start, count, seed=5)
    assert batch == nexmark_changes(start, count, seed=5)
    new = Counter(kind for kind, _ in generator.events(start, count))
    for name, changes in batch.items():
        keys = [row[COLUMNS[name].index(KEYS[name])] for _, row in changes]
        assert len(keys) == len(set(keys)), name  # one MERGE source row per key
        inserted = [row for change, row in changes if generator.index(row[COLUMNS[name].index("date_time")]) >= start]
        assert len(inserted) == new[name] and all(c == UPSERT for c, r in changes if r in inserted), name
        earlier = [(c, r) for c, r in changes if r not in inserted]
        assert len(earlier) == count // 100, name  # 10 draws, each a distinct earlier row here
        # Never the last cycle before the batch: the latest event in the tables stays where it was.
        assert all(generator.index(r[COLUMNS[name].index("date_time")]) < start - PROPORTION for _, r in earlier)
    assert {c for c, _ in batch["bids"] if c == DELETE} and all(c == UPSERT for c, _ in batch["persons"])
    moved = [r for c, r in batch["persons"] if generator.index(r[5]) < start]
    assert all(generator.event(generator.index(r[5]))[1][:3] == r[:3] for r in moved)  # the same person, moved
    assert nexmark_changes(0, 1000, seed=5)["bids"] == [
        (UPSERT, r) for k, r in generator.events(0, 1000) if k == "bids"
    ]
