"""Browser tests of the Load tests pages (headless Chromium through Playwright) against a real
array: a control plane, control loop and node agent with the bundled model on loopback. What a
person sees: live figures and drawn chart points while a run runs, then the report with its
curve, steps and findings; the Stop button keeping what was measured; a viewer without actions.
"""

from __future__ import annotations

import re

import pytest
from django.template.defaultfilters import floatformat
from playwright import sync_api as playwright_sync

from tests.console.conftest import BROWSER_USERS_SETUP, DRAWN_POINTS, browser_marks, shot
from tests.support.serving_array import serving_array

pytestmark = [*browser_marks(), pytest.mark.model]

SCENARIOS = """
from inference.loadtests.services import scenario_save
scenario_save(spec={"name": "browser-agents", "kind": "agent_sessions", "steps": [1, 2],
                    "turns": 3, "max_tokens": 8, "tool_max_tokens": 64, "max_s": 200,
                    "target_p95_s": 0.001})
"""


# where the live charts' legends and x-axis titles are drawn: [[legend box, title box], ...]
LEGEND_AND_AXIS_TITLE = """() => [...document.querySelectorAll('[id^=lt-chart-]')]
    .filter(el => el.querySelector('.legend') && el.querySelector('.g-xtitle text'))
    .map(el => [el.querySelector('.legend'), el.querySelector('.g-xtitle text')]
        .map(n => { const r = n.getBoundingClientRect();
                    return {top: r.top, bottom: r.bottom, left: r.left, right: r.right}; }))"""


def overlaps(a: dict, b: dict) -> bool:
    return not (
        a["bottom"] <= b["top"]
        or b["bottom"] <= a["top"]
        or a["right"] <= b["left"]
        or b["right"] <= a["left"]
    )


# the curve's traces as Plotly holds them: what the chart plots, by name
PLOTTED = """() => (document.getElementById('lt-chart-curve').data || [])
    .map(t => ({name: t.name, x: Array.from(t.x), y: Array.from(t.y)}))"""


def plotted(page) -> dict[str, dict]:
    return {t["name"]: t for t in page.evaluate(PLOTTED)}


def run_id_of(page) -> int:
    return int(page.url.rstrip("/").rsplit("/", 1)[-1].split("?")[0])


@pytest.fixture(scope="module")
def array(tmp_path_factory):
    home = tmp_path_factory.mktemp("browser-loadtests")
    with serving_array(home, setup=BROWSER_USERS_SETUP + SCENARIOS) as array:
        yield array


def test_an_operator_starts_a_run_follows_it_live_and_reads_its_report(page_as, array):
    page = page_as("operator")
    page.goto(f"{array.url}/loadtests/")
    page.select_option("#id_run-scenario", "browser-agents")
    page.fill("#id_run-target_url", array.url)
    page.click("#loadtest-form button[type=submit]")
    page.wait_for_url(f"{array.url}/loadtests/*/")
    expect = playwright_sync.expect
    expect(page.locator("#live-step")).to_contain_text("/ 2", timeout=60_000)
    page.wait_for_function(f"({DRAWN_POINTS})('lt-chart-throughput') > 1", timeout=60_000)
    page.wait_for_function(f"({DRAWN_POINTS})('lt-chart-cpu') > 1", timeout=30_000)
    drawn_boxes = page.evaluate(LEGEND_AND_AXIS_TITLE)
    assert drawn_boxes, "no live chart with a legend and an axis title"
    for legend, title in drawn_boxes:  # "s since start" stays readable
        assert not overlaps(legend, title), (legend, title)
    shot(page, "loadtest-live")
    # the run ends; the page reloads itself with the report
    expect(page.locator("#lt-report")).to_be_visible(timeout=180_000)
    expect(page.locator("#lt-state")).to_have_text("Succeeded")
    report = array.api("GET", f"/loadtests/{run_id_of(page)}/report").json()
    # no step meets the scenario's 1 ms target: the page answers at the tightest it meets
    summary = report["summary"]
    assert summary["knee_concurrency"] is None and summary["tightest_target_p95_s"], summary
    expect(page.locator("#sum-knee")).to_have_text("not met")
    knee, tightest = summary["tightest_knee_concurrency"], summary["tightest_target_p95_s"]
    expect(page.locator("#sum-knee-tightest")).to_have_text(
        f"{knee} session{'s' if knee != 1 else ''} at ≤ {tightest} s, "
        "the tightest target this run meets"
    )
    tiles = page.locator("#lt-summary")
    expect(tiles).to_contain_text(f"Sessions per node{summary['tightest_sessions_per_node']}")
    expect(tiles).to_contain_text(f"at ≤ {tightest} s (none at 0.001 s)")
    # written as the page's floatformat:5 rounds it (half up: 0.000285 is 0.00029, where
    # f"{0.000285:.5f}" gives 0.00028)
    cost = floatformat(summary["tightest_cost_per_session"], 5)
    expect(page.locator("#sum-cost")).to_have_text(re.compile(rf"^{re.escape(cost)} "))
    steps = page.locator("#lt-steps tbody tr")
    expect(steps).to_have_count(2)
    expect(steps.nth(1).locator("td").first).to_have_text("2")
    # the curve plots the report's figures: tokens/s and the P95 at each concurrency
    page.wait_for_function(f"({PLOTTED})().length >= 2", timeout=10_000)
    drawn = plotted(page)
    assert drawn["tokens/s"]["x"] == [1, 2]
    assert drawn["tokens/s"]["y"] == [p["tokens_per_s"] for p in report["curve"]]
    assert drawn["cache-hit TTFT P95 (s)"]["y"] == [p["p95_s"] for p in report["curve"]]
    expect(page.locator("#lt-nodes")).to_contain_text("node-lt1")
    findings = page.locator("#lt-findings li")
    if report["findings"]:
        for i, finding in enumerate(report["findings"]):
            expect(findings.nth(i)).to_contain_text(
                f"{finding['symptom']} → likely {finding['cause']}."
            )
    else:
        expect(findings).to_have_text(
            ["No findings: nothing in the metrics matched the troubleshooting table."]
        )
    # the plan shown first is at that tightest target too: nodes and cost, never "—"
    expect(page.locator("#lt-capacity")).to_contain_text(f"at P95 ≤ {tightest} s")
    expect(page.locator("#plan-nodes")).to_have_text(re.compile(r"^\d+$"))
    shot(page, "loadtest-report")


def test_stop_on_the_page_ends_the_run_and_keeps_what_it_measured(page_as, array):
    long_run = {
        "name": "browser-long",
        "kind": "steady",
        "concurrency": 1,
        "hold_s": 300,
        "turns": 4,
        "max_tokens": 8,
        "max_s": 400,
    }
    run = array.api("POST", "/loadtests", json={"spec": long_run, "target_url": array.url}).json()
    page = page_as("operator")
    page.goto(f"{array.url}/loadtests/{run['id']}/")
    page.wait_for_function(
        "() => Number((document.getElementById('live-rps') || {}).textContent) > 0",
        timeout=90_000,
    )
    page.click("#lt-stop")
    expect = playwright_sync.expect
    expect(page.locator("#lt-report")).to_be_visible(timeout=30_000)
    expect(page.locator("#lt-state")).to_have_text("Stopped")
    report = array.api("GET", f"/loadtests/{run['id']}/report").json()
    requests = page.locator("#lt-steps tbody tr").first.locator("td").nth(1)
    expect(requests).to_have_text(str(report["steps"][0]["requests"]))
    assert report["steps"][0]["requests"] >= 1
    # overlay the finished run of the first test: its curve plotted beside this one's
    first = next(r for r in array.api("GET", "/loadtests").json() if r["state"] == "succeeded")
    theirs = array.api("GET", f"/loadtests/{first['id']}/report").json()["curve"]
    page.goto(f"{array.url}/loadtests/{run['id']}/?overlay={first['id']}")
    page.wait_for_function(f"({PLOTTED})().length == 4", timeout=10_000)
    overlay = plotted(page)[f"run {first['id']} tokens/s"]
    assert overlay["x"] == [p["concurrency"] for p in theirs]
    assert overlay["y"] == [p["tokens_per_s"] for p in theirs]


def test_a_viewer_sees_runs_but_no_actions(page_as, array):
    page = page_as("viewer")
    page.goto(f"{array.url}/loadtests/")
    playwright_sync.expect(page.locator("#loadtest-runs")).to_contain_text("browser-agents")
    assert page.locator("#loadtest-form").count() == 0
    page.locator("#loadtest-runs a").first.click()
    playwright_sync.expect(page.locator("#lt-report")).to_be_visible()
    assert page.locator("#lt-stop").count() == 0
