"""Browser tests of the node pages: the console in headless Chromium (Debian's ``chromium``,
driven by Playwright with ``executable_path``) against a real control plane (daphne), control
loop and node agent with the bundled model, all on loopback. A node added on the Nodes page
becomes healthy without a reload, is drained from its page (and a viewer cannot drain it), and
its charts and the Utilization page's keep drawing. Screenshots go to
``artifacts/screenshots/``.
"""

from __future__ import annotations

import time
import uuid

import httpx
import pytest
from playwright import sync_api as playwright_sync

from nodes.credentials import node_credential, node_secret
from tests.console.conftest import DRAWN_POINTS, NODE_ID, browser_marks, shot
from tests.support.serving_array import PACKAGE

pytestmark = [*browser_marks(), pytest.mark.model]


def test_it_adds_a_node_and_watches_it_become_healthy(page_as, array, agent):
    page = page_as("admin")
    page.goto(f"{array.url}/nodes/")
    page.fill("#id_add-node_id", NODE_ID)
    page.fill("#id_add-address", agent.url.removeprefix("http://"))
    page.select_option("#id_add-package", label=f"{PACKAGE}:1")
    page.click("#add-node button[type=submit]")
    page.wait_for_url(f"{array.url}/nodes/{NODE_ID}/")
    state = page.locator(".title-row [data-field=state]")
    playwright_sync.expect(state).to_have_text("serving", timeout=120_000)  # no reload; validated
    playwright_sync.expect(page.locator("#events")).to_contain_text("Registered")
    shot(page, "node")
    page.goto(f"{array.url}/nodes/")
    playwright_sync.expect(
        page.locator(f'tr[data-node="{NODE_ID}"] [data-field=state]')
    ).to_have_text("serving")
    shot(page, "nodes")


def test_it_drains_a_node_from_its_page(page_as, array, healthy_node):
    page = page_as("operator")
    page.goto(f"{array.url}/nodes/{healthy_node}/")
    playwright_sync.expect(page.locator("button[data-action=undrain]")).to_be_hidden()
    status = page.locator("#drain-status")
    long_stream = {
        "model": PACKAGE,
        "messages": [{"role": "user", "content": "List numbers."}],
        "max_tokens": 1800,
        "temperature": 0,
        "stream": True,
        # at least 250 numbers: the stream outlasts the test (about 40 s on one CPU)
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "numbers",
                "schema": {"type": "array", "items": {"type": "integer"}, "minItems": 250},
            },
        },
    }
    auth = {"Authorization": f"Bearer {array.token}"}
    with httpx.stream(
        "POST", f"{array.url}/v1/chat/completions", json=long_stream, headers=auth, timeout=120
    ) as answer:
        lines = answer.iter_lines()  # held: dropping the iterator would close the stream
        next(line for line in lines if '"content": "' in line and '""' not in line)
        page.click("button[data-action=drain]")
        # what a person sees: a stream is still running, so stopping the node now would cut it
        playwright_sync.expect(status).to_contain_text("1 stream in flight", timeout=30_000)
        playwright_sync.expect(status).to_contain_text("Not safe to stop")
    # the client went away: the node cancelled the stream; nothing is in flight any more
    # (sessions other tests pinned here may remain: they would prefill again elsewhere)
    playwright_sync.expect(status).to_contain_text("no streams in flight", timeout=30_000)
    playwright_sync.expect(status).to_contain_text("Safe to stop")
    state = page.locator(".title-row [data-field=state]")
    playwright_sync.expect(state).to_have_text("draining")
    playwright_sync.expect(page.locator("button[data-action=undrain]")).to_be_visible()
    playwright_sync.expect(page.locator("button[data-action=drain]")).to_be_hidden()
    playwright_sync.expect(page.locator("#events")).to_contain_text("Drained")
    assert array.api("GET", f"/nodes/{healthy_node}").json()["state"] == "draining"
    shot(page, "node-draining")
    page.click("button[data-action=undrain]")
    playwright_sync.expect(state).to_have_text("serving", timeout=30_000)


def assert_chart_keeps_drawing(page, chart_id: str) -> None:
    """The chart's drawn line gains points as new samples arrive (it used to freeze)."""
    page.wait_for_function(f"({DRAWN_POINTS})('{chart_id}') > 1", timeout=30_000)
    first = page.evaluate(f"({DRAWN_POINTS})('{chart_id}')")
    page.wait_for_function(f"({DRAWN_POINTS})('{chart_id}') > {first + 2}", timeout=30_000)


def test_it_keeps_drawing_the_utilization_charts(page_as, array, healthy_node):
    page = page_as("viewer")
    page.goto(f"{array.url}/utilization/")
    assert_chart_keeps_drawing(page, "chart-cpu")
    before = page.locator("#chart-cpu").screenshot()
    page.wait_for_timeout(3000)
    assert page.locator("#chart-cpu").screenshot() != before  # the picture moves
    shot(page, "utilization")


def test_it_keeps_drawing_a_node_pages_charts(page_as, array, healthy_node):
    page = page_as("viewer")
    page.goto(f"{array.url}/nodes/{healthy_node}/")
    assert_chart_keeps_drawing(page, "chart-cpu")


def test_it_keeps_a_viewer_from_draining(page_as, array, healthy_node):
    page = page_as("viewer")
    page.goto(f"{array.url}/nodes/{healthy_node}/")
    assert page.locator("button[data-action=drain]").count() == 0
    status = page.evaluate(
        """async (url) => {
            const csrf = document.querySelector('[name=csrfmiddlewaretoken]').value;
            const r = await fetch(url, {method: 'POST', headers: {'X-CSRFToken': csrf}});
            return r.status; }""",
        f"/nodes/{healthy_node}/drain/",
    )
    assert status == 403
    api_status = page.evaluate(
        """async (url) => {
            const csrf = document.querySelector('[name=csrfmiddlewaretoken]').value;
            const r = await fetch(url, {method: 'POST', headers: {'X-CSRFToken': csrf}});
            return r.status; }""",
        f"/api/nodes/{healthy_node}/drain",
    )
    assert api_status == 403
    assert array.api("GET", f"/nodes/{healthy_node}").json()["state"] == "up"
    shot(page, "node-viewer")


def test_a_turns_lines_on_the_control_plane_and_the_node_share_its_request_id(
    page_as, array, healthy_node
):
    request_id = f"logs-{uuid.uuid4().hex[:12]}"
    answer = httpx.post(
        f"{array.url}/v1/chat/completions",
        json={"model": PACKAGE, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
        headers={"Authorization": f"Bearer {array.token}", "X-Request-Id": request_id},
        timeout=120,
    )
    assert answer.status_code == 200 and answer.headers["x-request-id"] == request_id
    page = page_as("viewer")
    page.goto(f"{array.url}/logs/")
    page.fill("input[name=request_id]", request_id)
    page.click("#log-filters button")
    page.check("#log-tail")  # the records arrive within about a second of the turn
    rows = page.locator("#log-records tbody tr")
    proxy_line = rows.filter(has_text="answer closed")
    node_line = rows.filter(has_text="chat answered")
    playwright_sync.expect(proxy_line).to_contain_text("serve", timeout=30_000)
    playwright_sync.expect(node_line).to_contain_text("runnode", timeout=30_000)
    for line in (proxy_line, node_line):
        playwright_sync.expect(line).to_contain_text(request_id)
        playwright_sync.expect(line).to_contain_text(healthy_node)
    shot(page, "logs")
    # and no secret is in any record any process shipped
    export = array.api("GET", "/logs?format=jsonl").text
    assert request_id in export and "runnode" in export
    for secret in (array.token, node_credential(healthy_node), node_secret()):
        assert secret not in export


def test_the_cache_page_shows_a_hit_and_an_operator_opts_a_tool_in(page_as, array, healthy_node):
    question = f"What is the capital of Peru? ({uuid.uuid4().hex[:6]})"
    asked = []
    for _ in range(2):
        answer = httpx.post(
            f"{array.url}/v1/chat/completions",
            json={
                "model": PACKAGE,
                "messages": [{"role": "user", "content": question}],
                "max_tokens": 8,
                "temperature": 0,
            },
            headers={"Authorization": f"Bearer {array.token}", "X-Phalanx-Cache": "use"},
            timeout=120,
        )
        asked.append(answer.headers["x-phalanx-cache"])
        model = answer.json()["model"]  # the client-facing name: the namespace's
        time.sleep(0.5)  # the answer is stored once its response went out
    assert asked == ["miss", "hit"]
    page = page_as("operator")
    page.goto(f"{array.url}/cache/")
    row = page.locator(f'#cache-table tr[data-namespace="answers:{model}"]')
    playwright_sync.expect(row.locator(".hit-rate")).to_have_text("50 %")
    page.fill("#id_name", "tools:get_weather")
    page.fill("#id_threshold", "0.8")
    page.click("#namespace-form button")
    tool_row = page.locator('#cache-table tr[data-namespace="tools:get_weather"]')
    playwright_sync.expect(tool_row).to_contain_text("yes")
    playwright_sync.expect(tool_row).to_contain_text("0.8")
    shot(page, "cache")


def test_an_operator_registers_an_agents_opening_and_sees_the_node_take_it(
    page_as, array, healthy_node
):
    page = page_as("operator")
    page.goto(f"{array.url}/prefixes/")
    page.fill("#id_name", "field-agent")
    page.fill("#id_system", "You are the field agent. Check the work order before answering.")
    page.fill("#id_tools", '[{"type": "function", "function": {"name": "order_find"}}]')
    page.click("#prefix-form button")
    row = page.locator('#prefixes-table tr[data-prefix="field-agent"]')
    playwright_sync.expect(row).to_contain_text("every model")
    held = row.locator(".held-by")
    deadline = time.monotonic() + 60
    while healthy_node not in held.inner_text() and time.monotonic() < deadline:
        page.wait_for_timeout(1000)  # the control loop sends it, then reads the node's metrics
        page.reload()
    playwright_sync.expect(held).to_have_text(healthy_node)
    shot(page, "prefixes")
    page.click('#prefixes-table tr[data-prefix="field-agent"] button')
    playwright_sync.expect(page.locator("#prefixes-table")).to_contain_text("No prefix registered.")
