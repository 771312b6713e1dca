"""The Dagster code location loads and its demo asset materializes on a real (ephemeral) instance."""

from dagster import materialize

from dagster_project.definitions import defs, nexmark_demo


def test_code_location_loads():
    assert defs.resolve_asset_graph().get_all_asset_keys()


def test_demo_asset_materializes_with_q4_equal_to_recompute(spark):
    result = materialize(
        [nexmark_demo],
        run_config={"ops": {"nexmark_demo": {"config": {"steps": 2, "events_per_step": 200, "workers": 2}}}},
    )
    assert result.success
    metadata = result.asset_materializations_for_node("nexmark_demo")[0].metadata
    assert metadata["q4_matches_recompute"].value is True
    assert metadata["events"].value == 400
