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
