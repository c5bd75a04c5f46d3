"""The Usage page in headless Chromium against a real control plane on a fresh SQLite, whose
usage rows are written directly (``tests.support.usage``: two callers, turns 10 and 5
minutes ago, a cost model of 250 EUR a node-month). What a person sees: the consumer's name
and cost in the table, and the tokens and cost plotted per token, then per model."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from playwright import sync_api as playwright_sync

from tests.console.conftest import BROWSER_USERS_SETUP, ShellArray, browser_marks, shell_array, shot
from tests.support.usage import ALPHA, COST_MODEL, OPS, TURNS, turn_figures

expect = playwright_sync.expect
pytestmark = browser_marks()

MINUTE_FILE = "usage-minute"
SETUP = (
    BROWSER_USERS_SETUP
    + f"""
import os, pathlib
from datetime import timedelta
from tests.support.usage import cost_model_set, usage_rows_create
cost_model_set()
minute = usage_rows_create()
first = (minute - timedelta(minutes=10)).isoformat()
pathlib.Path(os.environ["PHALANX_HOME"], {MINUTE_FILE!r}).write_text(first)
"""
)
PLOTTED = "(id) => document.getElementById(id).data.map(t => [t.name, t.x, t.y])"
DRAWN_BARS = "(id) => document.querySelectorAll('#' + id + ' .barlayer .point').length"


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def array(home) -> Iterator[ShellArray]:
    with shell_array(home, SETUP) as array:
        yield array


def per_node_second() -> float:
    """The cost model's price of a node-second: a node's month over 730 h of seconds."""
    c = COST_MODEL
    month = (
        c["power_w"] / 1000 * 730 * c["electricity_per_kwh"]
        + c["hardware_cost"] / c["amortization_months"]
        + c["operations_per_month"]
        + c["space_per_month"]
    )
    return month / (730 * 3600)


def money(value: float) -> str:
    return format(Decimal(f"{value:.6g}"), "f")


def plotted_at(home) -> tuple[str, str]:
    """The two minutes the rows were written for, as the chart's x axis writes them (UTC)."""
    first = datetime.fromisoformat((home / MINUTE_FILE).read_text())
    return tuple((first + timedelta(minutes=m)).strftime("%Y-%m-%d %H:%M:%S") for m in (0, 5))  # type: ignore[return-value]


def sums(who: dict, field: str) -> list[float]:
    """``field`` of ``who``'s turns summed per minute (10 then 5 minutes ago)."""
    out = []
    for ago in (10, 5):
        turns = [turn_figures(t) for t in TURNS if t[0] is who and t[1] == ago]
        if not turns:
            continue
        if field == "tokens":
            out.append(sum(t["prompt_tokens"] + t["completion_tokens"] for t in turns))
        else:
            seconds = sum(t["prefill_s"] + t["decode_s"] for t in turns)
            out.append(seconds * per_node_second())
    return out


def test_a_viewer_sees_consumers_and_the_plotted_usage(page_as, array, home):
    page = page_as("viewer")
    page.goto(f"{array.url}/usage/?hours=1")
    row = page.locator('#usage-consumers tr[data-caller="token:7"]')
    expect(row.locator("td").first).to_have_text("team-alpha")
    alpha_cost = sum(sums(ALPHA, "cost"))
    expect(row.locator("td.cost")).to_have_text(money(alpha_cost))
    expect(page.locator("#usage-consumers thead")).to_contain_text("Cost (EUR)")
    expect(page.locator("#usage-consumers tbody tr").first).to_have_attribute(
        "data-caller", "token:7"
    )  # the costliest first
    page.wait_for_function(f"({DRAWN_BARS})('usage-tokens-chart') === 3")
    m10, m5 = plotted_at(home)
    assert page.evaluate(PLOTTED, "usage-tokens-chart") == [
        ["ops", [m5], sums(OPS, "tokens")],
        ["team-alpha", [m10, m5], sums(ALPHA, "tokens")],
    ]
    cost = page.evaluate(PLOTTED, "usage-cost-chart")
    assert [(name, x) for name, x, _y in cost] == [("ops", [m5]), ("team-alpha", [m10, m5])]
    assert cost[0][2] == pytest.approx(sums(OPS, "cost"), rel=1e-5)
    assert cost[1][2] == pytest.approx(sums(ALPHA, "cost"), rel=1e-5)
    shot(page, "usage")

    page.click("#usage-group button[data-group=model]")
    expect(page.locator("#usage-group button[data-group=model]")).to_have_attribute(
        "aria-pressed", "true"
    )
    assert page.evaluate(PLOTTED, "usage-tokens-chart") == [
        ["gemma-3-270m", [m5], sums(OPS, "tokens")],
        ["smollm2-135m-instruct", [m10, m5], sums(ALPHA, "tokens")],
    ]
    href = page.locator("#usage-csv").get_attribute("href")
    assert href == "/api/usage.csv?hours=1"
    download = page.request.get(f"{array.url}{href}")
    assert download.status == 200 and download.text().splitlines()[0].startswith("minute,caller")
