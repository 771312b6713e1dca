"""The views' asset checks as Dagster sees them: one check per view, each property's bad
rows in its metadata (no Spark: the counts come from :func:`storage.inspect.check_outputs`)."""

import pytest
from dagster import AssetCheckKey, AssetKey

from dagster_project.config import demo_settings, parse_project
from dagster_project.factory import CHECK, build_definitions, check_results
from dagster_project.status import DeadLetterRate


def test_the_demo_defines_one_check_per_view():
    # Each check is planned and evaluated in every step run: two events Dagster stores.
    project = parse_project(demo_settings(), "demo")
    spec = project.pipelines[0]
    checks = build_definitions(project).resolve_asset_graph().asset_check_keys
    assert sorted(checks) == sorted(AssetCheckKey(AssetKey([spec.name, name]), CHECK) for name in spec.sink_names)
    assert len(checks) == 4


def test_a_view_fails_its_check_when_either_property_has_bad_rows():
    keys = {name: AssetKey(["p", name]) for name in ("clean", "dup", "negative", "bag")}
    bad = {
        ("clean", "consolidated"): 0,
        ("clean", "is_a_set"): 0,
        ("dup", "consolidated"): 2,
        ("dup", "is_a_set"): 0,
        ("negative", "consolidated"): 0,
        ("negative", "is_a_set"): 1,
        ("bag", "consolidated"): 0,
    }
    results = {r.asset_key.path[-1]: r for r in check_results(keys, bad)}
    assert list(results) == list(keys) and {r.check_name for r in results.values()} == {CHECK}
    assert {name: r.passed for name, r in results.items()} == {
        "clean": True,
        "dup": False,
        "negative": False,
        "bag": True,
    }
    assert {k: v.value for k, v in results["negative"].metadata.items()} == {
        "bad_rows/consolidated": 0,
        "bad_rows/is_a_set": 1,
    }
    assert {k: v.value for k, v in results["bag"].metadata.items()} == {"bad_rows/consolidated": 0}


def test_a_view_fails_its_check_when_an_input_it_reads_was_all_dead_letters():
    keys = {name: AssetKey(["p", name]) for name in ("reads_bids", "other")}
    bad = {(name, "consolidated"): 0 for name in keys}
    rate = DeadLetterRate("bids", "t.bids", 4, 0, ["partition 0 offset 0: wrong schema: field 'price' ..."])
    results = {r.asset_key.path[-1]: r for r in check_results(keys, bad, {"reads_bids": [rate], "other": []})}
    assert not results["reads_bids"].passed and results["other"].passed
    metadata = {k: v.value for k, v in results["reads_bids"].metadata.items()}
    assert metadata["dead_letters/bids"] == 4
    assert "offset 0: wrong schema: field 'price'" in metadata["dead_letter_reasons/bids"]
    assert "input 'bids' (topic 't.bids'): 4 of 4 records were dead letters (100%)" in results["reads_bids"].description


@pytest.mark.parametrize(
    ("dead", "decoded", "share", "loud"),
    [(1, 0, 1.0, True), (1, 1, 0.5, False), (2, 1, 0.5, True), (1, 9, 0.0, True), (1, 9, 0.1, False)],
)
def test_dead_letters_are_too_many_when_all_or_above_the_share(dead, decoded, share, loud):
    assert DeadLetterRate("a", "t", dead, decoded, []).too_high(share) is loud
