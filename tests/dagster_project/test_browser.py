"""The Dagster UI in a headless Chromium (Debian's ``chromium`` and ``chromium-driver``,
driven by selenium): the asset ``nexmark/q4`` shows its step partitions, a backfill of two
steps is launched by clicking through the materialize dialog, one run materializes both,
and the partition then shows the view's preview.  Screenshots go to the test's tmp_path."""

import shutil

import pytest
from dagster import AssetKey, DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.instance.ref import InstanceRef
from deltalake import DeltaTable

from dagster_project.step_worker import NEW_PROCESS, WORKER_TAG
from storage.pipeline import status

from .harness import Harness, dagster_dev, wait_for

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="needs Debian's chromium and chromium-driver on PATH (apt-get install chromium chromium-driver; .ci/run installs them)",
)

NAME = "nexmark"
Q4 = {"circuit": "circuits.library.nexmark_queries:nexmark_circuit", "sinks": ["q4"]}  # the demo's pipeline, q4 only
STEPS = ["0000000000", "0000000001"]
WAIT = 60  # seconds for the page to show something (a loaded 2-core machine renders slowly)


@pytest.fixture
def browser(tmp_path):
    """A headless Chromium through chromedriver; yields (driver, screenshot(name))."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))  # no download: Debian's driver
    driver.set_page_load_timeout(WAIT)
    shots = tmp_path / "screenshots"
    shots.mkdir()

    def screenshot(name: str) -> None:
        driver.save_screenshot(str(shots / f"{name}.png"))

    try:
        yield driver, screenshot
    finally:
        screenshot("last")  # what the page showed when the test ended, passed or not
        driver.quit()


@pytest.mark.slow
def test_backfill_of_two_steps_launched_from_the_asset_page(spark_resource, broker, tmp_path, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as shown
    from selenium.webdriver.support.ui import WebDriverWait

    driver, screenshot = browser
    wait = WebDriverWait(driver, WAIT)

    def element(xpath: str, within=None):
        return wait.until(
            lambda _: next((e for e in (within or driver).find_elements(By.XPATH, xpath) if e.is_displayed()), None)
        )

    def click(xpath: str, within=None) -> None:
        wait.until(shown.element_to_be_clickable(element(xpath, within))).click()

    # The runs use the test session's Spark Connect server (warm), not an embedded one.
    with dagster_dev(tmp_path, broker.bootstrap, NAME, spark_resource, **Q4) as (port, home):
        instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))
        served = Harness(tmp_path, broker.bootstrap, instance, name=NAME, spark=spark_resource, **Q4)
        for _ in STEPS:  # two steps divided by the sensor: two partitions
            served.produce(100)
            assert served.tick().run_requests

        driver.get(f"http://127.0.0.1:{port}/assets/{NAME}/q4")
        click("//*[@role='tab'][normalize-space(.)='Partitions']")
        for step in STEPS:
            element(f"//*[normalize-space(text())='{step}']")
        screenshot("1-partitions")

        click("//button[starts-with(normalize-space(.), 'Materialize')]")
        dialog = element("//*[@role='dialog'][.//button[starts-with(normalize-space(.), 'Launch')]]")
        click(".//*[@aria-haspopup='dialog']", dialog)  # the partition selector opens its list of keys
        for step in STEPS:
            click(f"//*[@role='menuitem'][.//*[normalize-space(text())='{step}']]")
        element(".//*[normalize-space(text())='2 partitions']", dialog)
        screenshot("2-dialog")
        click(".//*[contains(normalize-space(text()), 'materialize')]", dialog)  # the title: closes the list
        click(".//button[starts-with(normalize-space(.), 'Launch')]", dialog)
        wait.until(shown.staleness_of(dialog))
        element("//*[contains(normalize-space(text()), 'Created backfill')]")  # the toast
        screenshot("3-launched")

        wait_for(lambda: status(served.root).committed_step == len(STEPS), 150, "the backfill to commit both steps")
        backfills = instance.get_backfills()
        assert len(backfills) == 1, backfills
        runs = wait_for(
            lambda: instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.SUCCESS])),
            30,
            "the backfill's run to succeed",
        )
        assert [r.run_id for r in instance.get_runs()] == [runs[0].run_id]  # one run for both steps
        assert runs[0].tags["dagster/backfill"] == backfills[0].backfill_id
        assert runs[0].tags[WORKER_TAG] != NEW_PROCESS  # the resident step worker ran it
        events = instance.fetch_materializations(AssetKey([NAME, "q4"]), limit=10).records
        assert sorted(e.partition_key for e in events) == STEPS
        assert {e.run_id for e in events} == {runs[0].run_id}

        # The page shows both steps materialized and, per step, what the view holds.
        driver.get(f"http://127.0.0.1:{port}/assets/{NAME}/q4?view=partitions")
        click(f"//*[normalize-space(text())='{STEPS[-1]}']")
        preview = element("//tr[td[normalize-space(.)='view_preview']]//table")
        view = DeltaTable(
            str(tmp_path / "store" / NAME / "views" / "q4")
        ).to_pandas()  # a row per category: under the preview's 10
        assert [th.text for th in preview.find_elements(By.TAG_NAME, "th")] == list(view.columns)
        shown_rows = {
            tuple(td.text for td in tr.find_elements(By.TAG_NAME, "td"))
            for tr in preview.find_elements(By.XPATH, ".//tbody/tr")
        }
        assert shown_rows == {tuple(str(v) for v in row) for row in view.itertuples(index=False)}
        assert element("//tr[td[normalize-space(.)='view_rows']]/td[2]").text == str(len(view))
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", preview)
        screenshot("4-preview")
