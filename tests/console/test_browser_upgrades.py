"""The Upgrades page in headless Chromium against a real control plane (daphne) on a fresh
SQLite, with an upgrade written as the control loop leaves it mid-way (no loop runs here):
the node timeline and the gates read as text, the traffic split is drawn, and the page follows
the upgrade without a reload."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright import sync_api as playwright_sync

from tests.console.conftest import BROWSER_USERS_SETUP, ShellArray, browser_marks, shell_array, shot

pytestmark = browser_marks()

SETUP = (
    BROWSER_USERS_SETUP
    + """
from datetime import timedelta
from django.utils import timezone
from inference.models import ModelPackage, Upgrade, UpgradeSample
from inference.upgrades.services import upgrade_event
old = ModelPackage.objects.create(name="smol-q4_1", version="1", gguf_path="/x/a", sha256="a" * 64, status="approved")
new = ModelPackage.objects.create(name="smol-q4_k_m", version="1", gguf_path="/x/b", sha256="b" * 64, status="approved")
now = timezone.now().isoformat()
upgrade = Upgrade.objects.create(
    model="smol-q4_1", from_package=old, to_package=new, state="running", phase="baking batch 1",
    new_share=0.25, settings={"max_unavailable": 1, "canary_share": 0.25, "bake_s": 30, "drain_timeout_s": 120},
    nodes=[{"node_id": "node-01", "batch": 0, "state": "done", "since": now, "detail": "serves the new version and takes traffic"},
           {"node_id": "node-02", "batch": 1, "state": "waiting", "since": now, "detail": ""}],
    gates=[{"at": now, "node_id": "node-01", "gate": "smoke", "passed": True, "detail": "passed: tool_call, tool_result", "values": {}},
           {"at": now, "node_id": "", "gate": "bake", "verdict": "skipped", "passed": False, "detail": "skipped: too little traffic to compare (2 requests on the new version, 23 on the old; at least 3 each) after 60 s; paused by the upgrade's rule (no_traffic: pause)", "values": {}}],
    started_at=timezone.now())
upgrade_event(upgrade, "started", "the upgrade started")
ModelPackage.objects.create(name="smol-q2_k", version="1", gguf_path="/x/c", sha256="c" * 64, status="rejected",
    gate={"passed": False, "summary": "failed: tool_accuracy 0.31 < 0.50", "criteria": []})
for i in range(6):
    s = UpgradeSample.objects.create(upgrade=upgrade, old_sessions=6 - i, new_sessions=i, new_share=0.25)
    UpgradeSample.objects.filter(pk=s.pk).update(at=timezone.now() - timedelta(seconds=10 * (6 - i)))
"""
)


@pytest.fixture(scope="module")
def array(tmp_path_factory) -> Iterator[ShellArray]:
    with shell_array(tmp_path_factory.mktemp("home"), SETUP) as array:
        yield array


DRAWN_LINES = "() => document.querySelectorAll('#traffic-chart .scatterlayer .trace').length"


def set_state(array: ShellArray, state: str) -> None:
    array.shell(
        "from inference.models import Upgrade\n"
        f"Upgrade.objects.filter(model='smol-q4_1').update(state={state!r})\n"
    )


def test_what_an_operator_reads_a_skipped_bake_one_of_pause_resume_round_ticks(page_as, array):
    """Issue 28: a bake that compared nothing reads "skipped", not a green pass; only the
    button that applies (Pause while it runs, Resume while paused, following the state
    without a reload); the traffic split's share axis at round percentages; the versions
    not approved yet listed under the start form with their gate verdict and a link to
    approve them."""
    page = page_as("operator")
    page.goto(f"{array.url}/upgrades/")
    listed = page.locator("#unapproved-versions").get_by_role("row").filter(has_text="smol-q2_k:1")
    playwright_sync.expect(listed).to_contain_text("Rejected")
    playwright_sync.expect(listed).to_contain_text("failed: tool_accuracy 0.31 < 0.50")
    approve = listed.get_by_role("link", name="Approve with a reason →")
    playwright_sync.expect(approve).to_be_visible()
    assert approve.get_attribute("href").endswith("#approve-form")
    form = page.locator("#upgrade-form")
    playwright_sync.expect(form.get_by_label("When a bake compares nothing")).to_be_visible()
    assert form.evaluate("f => getComputedStyle(f).display") == "grid"  # fields in rows
    shot(page, "upgrades-start-form")
    page.click("#upgrade-history a")
    gate = page.locator("#upgrade-gates").get_by_role("row").filter(has_text="array")
    playwright_sync.expect(gate.get_by_role("cell").nth(2)).to_have_text("bake")
    playwright_sync.expect(gate.get_by_role("cell").nth(3)).to_have_text("– skipped")
    playwright_sync.expect(gate.get_by_role("cell").nth(4)).to_contain_text(
        "skipped: too little traffic to compare (2 requests on the new version, 23 on the old"
    )
    assert "pass" not in gate.get_by_role("cell").nth(3).inner_text()
    pause = page.get_by_role("button", name="Pause")
    resume = page.get_by_role("button", name="Resume")
    playwright_sync.expect(pause).to_be_visible()
    playwright_sync.expect(resume).to_be_hidden()
    page.wait_for_function(f"({DRAWN_LINES})() >= 3")
    ticks = page.locator("#traffic-chart .y2tick text").evaluate_all(
        "texts => texts.map(t => t.textContent)"
    )
    assert ticks == ["0 %", "25 %", "50 %", "75 %", "100 %"]
    set_state(array, "paused")
    playwright_sync.expect(resume).to_be_visible(timeout=15_000)
    playwright_sync.expect(pause).to_be_hidden()
    playwright_sync.expect(page.get_by_role("button", name="Promote now")).to_be_visible()
    shot(page, "upgrade-skipped-bake")
    set_state(array, "running")
    playwright_sync.expect(pause).to_be_visible(timeout=15_000)
    playwright_sync.expect(resume).to_be_hidden()


def test_the_upgrade_page_shows_the_timeline_gates_and_traffic_and_follows_it(page_as, array):
    page = page_as("operator")
    page.goto(f"{array.url}/upgrades/")
    row = page.locator("#upgrade-history tbody tr")
    for text in ("smol-q4_1:1", "smol-q4_k_m:1", "Running", "baking batch 1"):
        playwright_sync.expect(row).to_contain_text(text)
    page.click("#upgrade-history a")
    nodes = page.locator("#upgrade-nodes")
    playwright_sync.expect(nodes.get_by_role("row", name="node-01 1 done")).to_be_visible()
    playwright_sync.expect(nodes.get_by_role("row").filter(has_text="node-02")).to_contain_text(
        "waiting"
    )
    gate = page.locator("#upgrade-gates").get_by_role("row").filter(has_text="smoke")
    playwright_sync.expect(gate.get_by_role("cell").nth(3)).to_have_text("✓ pass")
    playwright_sync.expect(gate.get_by_role("cell").nth(4)).to_have_text(
        "passed: tool_call, tool_result"
    )
    playwright_sync.expect(page.locator("#upgrade-share")).to_have_text("25%")
    page.wait_for_function(f"({DRAWN_LINES})() >= 3")
    page.evaluate("window.notReloaded = true")
    array.shell(
        "from inference.models import Upgrade\n"
        "u = Upgrade.objects.get()\n"
        "u.nodes[1]['state'] = 'draining'\n"
        "u.nodes[1]['detail'] = 'drained: no new sessions'\n"
        "u.state = 'rolling_back'\n"
        "u.reason = 'bake of batch 1: error rate 10.0% (new) against 1.0% (old), at most 3.0%'\n"
        "u.save()\n"
    )
    playwright_sync.expect(nodes.get_by_role("row").filter(has_text="node-02")).to_contain_text(
        "draining", timeout=15_000
    )
    playwright_sync.expect(page.locator("#upgrade-state")).to_have_text("rolling back")
    playwright_sync.expect(page.locator("#upgrade-reason")).to_contain_text("error rate 10.0%")
    assert page.evaluate("window.notReloaded") is True
    shot(page, "upgrade")


def test_a_viewer_sees_no_actions_and_cannot_start_one(page_as, array):
    page = page_as("viewer")
    page.goto(f"{array.url}/upgrades/")
    assert page.locator("#upgrade-form").count() == 0
    page.click("#upgrade-history a")
    assert page.locator("#upgrade-actions").count() == 0
