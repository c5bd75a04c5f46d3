"""The Device validation pages in headless Chromium against a real control plane on a fresh
SQLite: validation runs are written through the real services from fixture machines' reports
(no control loop runs here), so the test plays the loop's part. What a person sees: the status
of every node, the matrix results and the inventory as text, the benchmark bars drawn beside
the pool's, the diff of a firmware change, and "validate now" with live progress."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright import sync_api as playwright_sync

from tests.console.conftest import BROWSER_USERS_SETUP, ShellArray, browser_marks, shell_array, shot

expect = playwright_sync.expect
pytestmark = browser_marks()

SETUP = (
    BROWSER_USERS_SETUP
    + """
import copy
from inference.models import ModelPackage
from nodes.device_validation import validation_finish, validation_request
from nodes.services import node_upsert
from tests.support.validation import machine_report
package = ModelPackage.objects.create(name="smol", version="1", gguf_path="/x/a", sha256="a" * 64, status="approved")
for node_id, decode in (("node-02", 200.0), ("node-01", 300.0)):
    node_upsert(node_id=node_id, address="127.0.0.1:9", package_id=package.pk)
    run = validation_request(node_id=node_id, trigger="start")
    validation_finish(run, machine_report("nvidia-l4", decode_8=decode, threads=4))
report = machine_report("nvidia-l4", decode_8=300.0, threads=4)
report["inventory"]["firmware"]["bios_version"] = "2.4.1"
run = validation_request(node_id="node-01", trigger="change")
validation_finish(run, report)
"""
)

FINISH = """
from nodes.device_validation import validation_finish
from nodes.models import ValidationRun
from tests.support.validation import machine_report
run = ValidationRun.objects.get(state__in=("queued", "running"))
validation_finish(run, machine_report("xeon-2numa-avx512", decode_8=250.0, threads=4))
"""


@pytest.fixture(scope="module")
def array(tmp_path_factory) -> Iterator[ShellArray]:
    with shell_array(tmp_path_factory.mktemp("home"), SETUP) as array:
        yield array


DRAWN_BARS = "() => document.querySelectorAll('#bench-chart .barlayer .point').length"
PLOTTED = "() => document.getElementById('bench-chart').data.map(t => [t.name, t.x, t.y])"
AXIS_TITLES = (
    "() => [...document.querySelectorAll('#bench-chart .g-ytitle, #bench-chart .g-y2title')]"
    ".map(t => t.textContent)"
)
TOK_S = ["Prompt processing", "Decode, 1 sequence", "Decode, 8 sequences"]


def test_the_pages_show_status_report_diff_and_follow_validate_now(page_as, array):
    page = page_as("operator")
    page.goto(f"{array.url}/validation/")
    row = page.locator("#validation-nodes tbody tr").filter(has_text="node-02")
    expect(row).to_contain_text("Passed with warnings")
    expect(row).to_contain_text("has no CUDA")
    expect(row).to_contain_text("200.0 tok/s")
    page.click("#validation-nodes a:text('node-01')")
    expect(page.locator("#node-validation")).to_have_text("Passed with warnings")
    rules = page.locator("#matrix-results")
    expect(
        rules.get_by_role("row", name=re.compile(r"^threads pass threads 4 ≤ CPU budget 8"))
    ).to_be_visible()
    expect(
        rules.get_by_role("row", name=re.compile(r"^kernel_errors warn 2 kernel errors"))
    ).to_be_visible()
    expect(page.locator("#inventory")).to_contain_text("AMD EPYC 9124 16-Core Processor")
    expect(page.locator("#inventory")).to_contain_text("NVIDIA L4 driver 535.161.08")
    figures = page.locator("#bench-figures").get_by_role("row").filter(has_text="Decode, 8")
    expect(figures).to_contain_text("300.0 tok/s")
    expect(figures).to_contain_text("200.0 tok/s")  # the pool: node-02
    page.wait_for_function(f"({DRAWN_BARS})() == 8")  # 4 figures, this node and the pool
    # the values plotted: this node's last run beside the pool (node-02 alone, 200 tok/s)
    # GB/s and tok/s on axes of their own, each titled with its unit
    assert page.evaluate(PLOTTED) == [
        ["this node", ["Memory bandwidth"], [12.0]],
        ["pool median", ["Memory bandwidth"], [12.0]],
        ["this node", TOK_S, [2000.0, 90.0, 300.0]],
        ["pool median", TOK_S, [2000.0, 90.0, 200.0]],
    ]
    assert page.evaluate(AXIS_TITLES) == ["memory bandwidth, GB/s", "tokens/s (log scale)"]
    history = page.locator("#validation-history tbody tr").first
    expect(history).to_contain_text("Inventory changed")
    expect(history).to_contain_text("firmware.bios_version: 2.3.5 → 2.4.1")

    page.click("#validate-button")
    expect(page.locator("#run-phase")).to_contain_text("queued")
    expect(page.locator("#validate-button")).to_be_disabled()
    page.evaluate("window.notReloaded = true")
    array.shell(
        "from nodes.models import ValidationRun\n"
        "ValidationRun.objects.filter(state='queued').update("
        "state='running', phase='decode, 8 sequences', progress=0.6)\n"
    )
    expect(page.locator("#run-phase")).to_contain_text("running · decode, 8 sequences (60%)")
    assert page.evaluate("window.notReloaded") is True
    array.shell(FINISH)
    # the run ended: the page reloads with the new report
    expect(page.locator("#inventory")).to_contain_text(
        "Intel(R) Xeon(R) Gold 6338N", timeout=15_000
    )
    expect(page.locator("#validation-history tbody tr").first).to_contain_text("On demand")
    expect(
        page.locator("#matrix-results").get_by_role(
            "row", name=re.compile(r"^numa warn .*span NUMA nodes 0, 1")
        )
    ).to_be_visible()
    shot(page, "validation")


def test_a_viewer_cannot_validate_or_waive(page_as, array):
    page = page_as("viewer")
    page.goto(f"{array.url}/validation/node-02/")
    expect(page.locator("#node-validation")).to_be_visible()
    assert page.locator("#validate-button").count() == 0
    assert page.locator("#waive-form").count() == 0
