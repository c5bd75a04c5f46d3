"""A real embedded array (``manage.py up --nodes 2``) in headless Chromium: what a person
reads of nodes that do not take traffic. While the nodes validate, the overview says so and
counts none as serving (never "up" in green); a node agent killed with SIGKILL shows as
restarting, then its last error ("exited with status -9") with its time stays on the overview
after it is back; Restart on a node's page drains it and the array restarts its agent, and the
event names the operator (issue 28)."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import pytest
from playwright import sync_api as playwright_sync

from tests.console.conftest import browser_marks, shot
from tests.support.processes import REPO, free_port

expect = playwright_sync.expect
pytestmark = [*browser_marks(), pytest.mark.model]

# Every badge text each node row showed, as the page drew it (the live socket redraws it).
RECORD_BADGES = """() => {
  window.badges = {};
  const note = () => document.querySelectorAll('#nodes-table tr[data-node]').forEach(r => {
    const text = r.querySelector('[data-field=state]').textContent;
    (window.badges[r.dataset.node] = window.badges[r.dataset.node] || []);
    const seen = window.badges[r.dataset.node];
    if (seen[seen.length - 1] !== text) seen.push(text);
  });
  note();
  new MutationObserver(note).observe(document.getElementById('nodes-table'),
    {subtree: true, childList: true, characterData: true});
}"""


@dataclass
class UpArray:
    url: str
    password: str
    process: subprocess.Popen
    lines: queue.Queue
    seen: list[str]

    def read_until(self, marker: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no line with {marker!r}:\n" + "\n".join(self.seen)
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(line)
            if marker in line:
                return line

    def agent(self, node_id: str) -> psutil.Process:
        """The node agent process ``up`` started for ``node_id``."""
        for child in psutil.Process(self.process.pid).children():
            argv = child.cmdline()
            if "runnode" in argv and node_id in argv:
                return child
        raise AssertionError(f"no agent of {node_id} under up")


def _lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line.rstrip("\n"))


@pytest.fixture(scope="module")
def array(tmp_path_factory) -> Iterator[UpArray]:
    home = tmp_path_factory.mktemp("up-home")
    (home / "models").symlink_to(REPO / "var" / "models")  # the bundled model, fetched once
    port = free_port()
    env = {**os.environ, "PHALANX_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env.pop("DATABASE_URL", None)
    env.pop("PHALANX_SQLITE", None)
    process = subprocess.Popen(
        [sys.executable, "manage.py", "up", "--nodes", "2", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(process.stdout, lines), daemon=True).start()
    up = UpArray(f"http://127.0.0.1:{port}", "", process, lines, [])
    try:
        up.password = up.read_until("admin login: admin / ", 300).split(" / ", 1)[1]
        up.read_until("Ctrl-C stops everything.", 60)
        yield up
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture
def admin_page(browser, array):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{array.url}/login/")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", array.password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{array.url}/")
    yield page
    context.close()


def badge(page, node_id: str):
    return page.locator(f'#nodes-table tr[data-node="{node_id}"] [data-field=state]')


def test_validating_nodes_are_not_up_and_a_killed_agent_shows_with_its_last_error(
    admin_page, array
):
    page = admin_page
    page.evaluate(RECORD_BADGES)
    expect(page.locator("#tile-serving")).to_have_text("0")  # both still validating
    for node_id in ("node-01", "node-02"):
        expect(badge(page, node_id)).to_have_text("serving", timeout=240_000)
    expect(page.locator("#tile-serving")).to_have_text("2")
    shown = page.evaluate("window.badges")
    for node_id in ("node-01", "node-02"):
        assert "validating" in shown[node_id] and "up" not in shown[node_id], shown

    page.evaluate(RECORD_BADGES)
    array.agent("node-01").send_signal(signal.SIGKILL)
    error = page.locator('#nodes-table tr[data-node="node-01"] [data-field=error]')
    expect(badge(page, "node-01")).not_to_have_text("serving", timeout=30_000)
    # back, validated again: serving, and its last error still says what happened, and when
    expect(badge(page, "node-01")).to_have_text("serving", timeout=240_000)
    expect(error).to_have_text(
        re.compile(r"^Restarted: node agent exited with status -9 after"), timeout=30_000
    )
    error_at = page.locator('#nodes-table tr[data-node="node-01"] [data-field=error_at]')
    expect(error_at).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+$"))
    expect(page.locator("#tile-errors")).to_have_text("1")
    shown = page.evaluate("window.badges")["node-01"]
    assert shown[0] == "serving" and "restarting" in shown and shown[-1] == "serving", shown
    assert "up" not in shown, shown
    page.reload()  # the page as drawn from the database says the same
    expect(error).to_have_text(re.compile(r"node agent exited with status -9"))
    expect(page.locator("#events")).to_contain_text("node agent exited with status -9")
    expect(page.locator("#events")).to_contain_text("by up")
    shot(page, "overview-after-a-kill")


def test_restart_drains_the_node_and_the_array_restarts_its_agent(admin_page, array):
    page = admin_page
    expect(badge(page, "node-02")).to_have_text("serving", timeout=240_000)
    before = array.agent("node-02").pid
    page.goto(f"{array.url}/nodes/node-02/")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#restart-button")
    expect(page.locator(".flash, .messages, body").first).to_contain_text(
        "Restarting node-02: drained now"
    )
    expect(page.locator("#events")).to_contain_text("drained by admin to restart it")
    array.read_until("node-02 restarted at an operator's request", 120)
    assert array.agent("node-02").pid != before
    page.goto(f"{array.url}/")
    expect(badge(page, "node-02")).to_have_text("serving", timeout=240_000)
    page.goto(f"{array.url}/nodes/node-02/")
    events = page.locator("#events")
    expect(events).to_contain_text("restarted at the request of admin")
    expect(events).to_contain_text("undrained by admin")
