"""Browser tests of the console as a whole: the console in headless Chromium (Debian's
``chromium``, driven by Playwright with ``executable_path``) against a real control plane
(daphne), control loop and node agent with the bundled model, all on loopback. Logging in,
every page (what it is for, nothing loaded from outside loopback, one time format), the
Playground, the Routing table, a Config dry run and the Audit page; the node pages are
``test_browser_node_pages.py``. Screenshots of each page go to ``artifacts/screenshots/``.
"""

from __future__ import annotations

import time
from urllib.parse import urlparse

import httpx
import pytest
from playwright import sync_api as playwright_sync

from tests.console.conftest import BROWSER_PASSWORD as PASSWORD
from tests.console.conftest import browser_marks, shot
from tests.support.processes import manage_shell
from tests.support.serving_array import PACKAGE

pytestmark = [*browser_marks(), pytest.mark.model]


def test_it_logs_in(browser, array):
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{array.url}/nodes/")
    assert "/login/" in page.url
    shot(page, "login")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", "wrong")
    page.click("button[type=submit]")
    assert page.locator(".error").is_visible()
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{array.url}/nodes/")
    assert page.locator("h1").inner_text() == "Nodes"
    page.wait_for_selector("#live-status.on")
    context.close()


def test_it_chats_in_the_playground_and_shows_node_and_timings(page_as, array, healthy_node):
    page = page_as("viewer")
    page.goto(f"{array.url}/playground/")
    page.fill("#max-tokens", "12")
    page.fill("#message", "Say hello.")
    page.click("#send")
    meta = page.locator(".msg.assistant .meta.done")
    playwright_sync.expect(meta).to_contain_text(f"on {healthy_node}", timeout=120_000)
    assert "TTFT" in meta.inner_text() and "tok/s" in meta.inner_text()
    assert page.locator(".msg.assistant .content").inner_text().strip()
    shot(page, "playground")


def test_every_page_shows_what_it_is_for(page_as, array, healthy_node):
    page = page_as("admin")
    package_id = array.api("GET", "/packages").json()[0]["id"]
    pages = {  # name: (path, text a person must see there)
        "overview": ("/", healthy_node),
        "packages": ("/packages/", PACKAGE),
        "package": (f"/packages/{package_id}/", "Q4_1"),
        "routing": ("/routing/", "Routing table"),
        "tokens": ("/tokens/", "tests"),  # the token the array fixture issued
        "config": ("/config/", f"id: {healthy_node}"),
        "audit": ("/audit/", "Who"),
        "api-docs": ("/api/docs", "Phalanx admin API"),
    }
    for name, (path, text) in pages.items():
        response = page.goto(f"{array.url}{path}")
        assert response is not None and response.status == 200, path
        playwright_sync.expect(page.get_by_text(text).first).to_be_visible()
        shot(page, name)
    page.goto(f"{array.url}/")
    playwright_sync.expect(
        page.locator(f'tr[data-node="{healthy_node}"] [data-field=state]')
    ).to_have_text("serving")


def test_no_page_loads_anything_from_outside_loopback(page_as, array, healthy_node):
    page = page_as("admin")
    outside: list[str] = []

    def only_loopback(route) -> None:
        host = urlparse(route.request.url).hostname or ""
        if host in ("127.0.0.1", "localhost", "::1") or route.request.url.startswith("data:"):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.context.route("**/*", only_loopback)
    package_id = array.api("GET", "/packages").json()[0]["id"]
    for path in (
        "/",
        "/nodes/",
        f"/nodes/{healthy_node}/",
        "/packages/",
        f"/packages/{package_id}/",
        "/routing/",
        "/utilization/",
        "/playground/",
        "/tokens/",
        "/config/",
        "/admin/",
        "/api/docs",
    ):
        page.goto(f"{array.url}{path}")
        page.wait_for_load_state("networkidle")
    # the API docs render from the project's own Swagger UI files: the title shows
    playwright_sync.expect(page.get_by_text("Phalanx admin API").first).to_be_visible()
    page.goto(f"{array.url}/admin/")
    # the admin is styled: its header has the stylesheet's background, not the default white
    header = page.locator("#header")
    assert header.evaluate("e => getComputedStyle(e).backgroundColor") != "rgba(0, 0, 0, 0)"
    assert outside == []


def test_a_config_dry_run_shows_each_change_and_does_not_stick(page_as, array, healthy_node):
    page = page_as("admin")
    page.goto(f"{array.url}/config/")
    current = page.locator("#config-current").inner_text()
    changed = current.replace("max_attempts: 3", "max_attempts: 5")
    assert changed != current
    page.fill("#id_text", changed)
    page.check("#id_dry_run")
    page.click("#config-form button")
    playwright_sync.expect(page.locator("#config-report")).to_contain_text("Dry run")
    playwright_sync.expect(page.locator("#config-changes")).to_contain_text(
        "routing.max_attempts: 3 \u2192 5"
    )
    playwright_sync.expect(page.locator("#id_dry_run")).not_to_be_checked()
    assert array.api("GET", "/routing/policy").json()["max_attempts"] == 3
    page.click("#config-form button")  # the operator's next Apply applies
    playwright_sync.expect(page.locator("#config-report")).to_contain_text("Applied")
    assert array.api("GET", "/routing/policy").json()["max_attempts"] == 5
    array.api("PUT", "/routing/policy", json={"max_attempts": 3})


def test_the_audit_page_shows_who_changed_what(page_as, array, healthy_node):
    page = page_as("operator")
    page.goto(f"{array.url}/nodes/{healthy_node}/")
    page.click("button[data-action=drain]")
    playwright_sync.expect(page.locator(".title-row [data-field=state]")).to_have_text("draining")
    page.click("button[data-action=undrain]")
    page.goto(f"{array.url}/audit/")
    row = page.locator("#audit tbody tr", has_text="node.drain").first
    playwright_sync.expect(row).to_contain_text("operator")
    playwright_sync.expect(row).to_contain_text(healthy_node)
    playwright_sync.expect(
        page.locator("#audit tbody tr", has_text="node.undrain").first
    ).to_be_visible()
    shot(page, "audit")


def test_the_routing_table_shows_a_new_session_live_and_its_decisions(page_as, array, healthy_node):
    page = page_as("viewer")
    page.goto(f"{array.url}/routing/")
    session = f"live-{int(time.time() * 1000)}"
    playwright_sync.expect(page.locator("#routes-body")).not_to_contain_text(session)
    answer = httpx.post(
        f"{array.url}/v1/chat/completions",
        json={"model": PACKAGE, "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 4},
        headers={"Authorization": f"Bearer {array.token}", "X-Session-Id": session},
        timeout=120,
    )
    assert answer.status_code == 200
    row = page.locator("#routes-body tr", has_text=session)  # no reload: the table refreshes
    playwright_sync.expect(row).to_contain_text(healthy_node, timeout=15_000)
    row.locator("a[href^='/sessions/']").first.click()
    playwright_sync.expect(page.locator("#decisions")).to_contain_text(f"placed on {healthy_node}")
    shot(page, "session")


UPGRADED = """
from inference.models import ModelPackage
from nodes.models import Node
old = ModelPackage.objects.get(name="{old}", version="1")
new, _ = ModelPackage.objects.get_or_create(
    name="{new}", version="1",
    defaults=dict(family=old.family, gguf_path=old.gguf_path, sha256=old.sha256,
                  quantization="Q4_K_M", status="approved"),
)
Node.objects.filter(node_id="{node}").update(package=new, served_name="{old}")
"""

RESTORED = """
from inference.models import ModelPackage
from nodes.models import Node
Node.objects.filter(node_id="{node}").update(
    package=ModelPackage.objects.get(name="{old}", version="1"), served_name=""
)
"""


def test_the_playground_names_the_family_and_the_version_serving_after_an_upgrade(
    page_as, array, healthy_node
):
    """The state a Q4_1 -> Q4_K_M upgrade leaves (issue 28): the node's package is the new
    version, served as the old name. The Playground offers the family with its up count and
    the version on it; an answer says which version served it."""
    new = "smollm2-135m-instruct-q4_k_m"
    names = {"old": PACKAGE, "new": new, "node": healthy_node}
    manage_shell(array.env or {}, UPGRADED.format(**names))
    try:
        page = page_as("viewer")
        page.goto(f"{array.url}/playground/")
        options = page.locator("#model option").all_inner_texts()
        assert [o.split(" (")[0] for o in options] == ["smollm2-135m-instruct"]
        assert options[0].startswith(f"smollm2-135m-instruct (1 up: {new}:1 on 1")
        page.fill("#max-tokens", "8")
        page.fill("#message", "Say hello.")
        page.click("#send")
        meta = page.locator(".msg.assistant .meta.done")
        playwright_sync.expect(meta).to_contain_text(f"{new}:1 on {healthy_node}", timeout=120_000)
        assert page.locator(".msg.assistant .content").inner_text().strip()
        shot(page, "playground-after-upgrade")
    finally:
        manage_shell(array.env or {}, RESTORED.format(**names))


def test_the_playground_samples_each_message_with_its_own_seed_and_says_so(
    page_as, array, healthy_node
):
    """Issue 28: 14 prompts got one answer. The page now sends its temperature and a seed
    drawn per message (shown with each answer), and says why a long session repeats itself;
    the same seed and prompt in a fresh session give the same answer."""
    page = page_as("viewer")
    page.goto(f"{array.url}/playground/")
    note = page.locator("#sampling-note").inner_text()
    assert "reads the whole conversation" in note and "New session" in note
    page.fill("#max-tokens", "8")
    metas = page.locator(".msg.assistant .meta.done")
    for i, prompt in enumerate(("Name a fruit.", "Name a colour.")):
        page.fill("#message", prompt)
        page.click("#send")
        playwright_sync.expect(metas).to_have_count(i + 1, timeout=120_000)
    seeds = [m.split("seed ")[1].split(" ")[0] for m in metas.all_inner_texts()]
    assert all("temperature 0.8" in m for m in metas.all_inner_texts())
    assert seeds[0] != seeds[1]
    answers = []
    for _ in range(2):
        page.click("#new-session")
        page.fill("#seed", "1234")
        page.fill("#message", "Write one word.")
        page.click("#send")
        playwright_sync.expect(metas).to_have_count(1, timeout=120_000)
        assert "seed 1234" in metas.inner_text()
        answers.append(page.locator(".msg.assistant .content").inner_text())
    assert answers[0] == answers[1]


TIME_PAGES = (
    "/",
    "/nodes/{node}/",
    "/packages/",
    "/packages/{package}/",
    "/tokens/",
    "/audit/",
    "/routing/",
    "/sessions/{session}/",
    "/validation/",
    "/validation/{node}/",
)
READ_TIMES = """() => [...document.querySelectorAll('time')].filter(t => !t.hidden)
  .map(t => [t.getAttribute('datetime'), t.textContent])"""


def test_every_time_reads_one_format_in_the_operators_time_zone(browser, array, healthy_node):
    """Every moment on every page reads ``YYYY-MM-DD HH:MM:SS ZONE`` in the browser's time zone
    (one the server does not use), never another format (issue 28)."""
    from datetime import datetime, timedelta, timezone

    session = f"times-{int(time.time() * 1000)}"
    answer = httpx.post(
        f"{array.url}/v1/chat/completions",
        json={"model": PACKAGE, "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 4},
        headers={"Authorization": f"Bearer {array.token}", "X-Session-Id": session},
        timeout=120,
    )
    assert answer.status_code == 200
    package = array.api("GET", "/packages").json()[0]["id"]
    context = browser.new_context(timezone_id="Asia/Kolkata", locale="de-DE")
    page = context.new_page()
    page.goto(f"{array.url}/login/")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{array.url}/")
    india = timezone(timedelta(hours=5, minutes=30))
    try:
        for path in TIME_PAGES:
            page.goto(array.url + path.format(node=healthy_node, package=package, session=session))
            page.wait_for_function("document.querySelector('time[data-shown]') !== null")
            shown = page.evaluate(READ_TIMES)
            assert shown, f"{path}: no time on the page"
            for iso, text in shown:
                expected = datetime.fromisoformat(iso).astimezone(india)
                assert text == f"{expected:%Y-%m-%d %H:%M:%S} GMT+5:30", (path, iso, text)
        shot(page, "times-in-the-operators-zone")
    finally:
        context.close()
