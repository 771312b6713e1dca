"""The views' asset checks as Dagster sees them: one check per view, each property's bad
rows in its metadata (no Spark: the counts come from :func:`storage.inspect.check_outputs`)."""

from dagster import AssetCheckKey, AssetKey

from dagster_project.config import demo_settings, parse_project
from dagster_project.factory import CHECK, build_definitions, check_results


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
