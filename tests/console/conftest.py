from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from console.lib.access import user_set_role
from console.models import Role
from inference.models import ModelPackage
from inference.tokens import token_issue
from nodes.models import Node
from tests.support.processes import REPO, Proc, control_plane_at_home, spawn, start_node
from tests.support.serving_array import FAST_LOOP, PACKAGE

PASSWORD = "pw-for-tests"


@pytest.fixture(autouse=True)
def fast_passwords(settings) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def package(db) -> ModelPackage:
    return ModelPackage.objects.create(
        name="smollm2-test",
        version="1",
        gguf_path="/nonexistent/x.gguf",
        sha256="0" * 64,
        quantization="Q4_1",
        context_window=2048,
    )


@pytest.fixture
def node(db, package) -> Node:
    return Node.objects.create(
        validation="passed",
        node_id="node-01",
        address="127.0.0.1:9401",
        package=package,
        state=Node.State.UP,
    )


@pytest.fixture
def make_user(db) -> Callable[[str, Role | None], object]:
    def make(username: str, role: Role | None) -> object:
        user = get_user_model().objects.create_user(username=username, password=PASSWORD)
        user_set_role(user=user, role=role)
        return user

    return make


@pytest.fixture
def users(make_user) -> dict[str, object]:
    return {role.value: make_user(role.value, role) for role in Role} | {
        "nobody": make_user("nobody", None)
    }


@pytest.fixture
def login(users) -> Callable[[str], Client]:
    def make(role: str) -> Client:
        client = Client()
        client.force_login(users[role])
        return client

    return make


@pytest.fixture
def tokens(db) -> dict[str, str]:
    """Plaintext API tokens by role."""
    return {role.value: token_issue(name=f"t-{role.value}", role=role)[1] for role in Role}


@pytest.fixture
def api(tokens) -> Callable[..., object]:
    """``api(role, method, path, json=None)`` → response, with that role's Bearer token."""

    def call(role: str | None, method: str, path: str, json: object = None, **extra):
        client = Client()
        headers = {"Authorization": f"Bearer {tokens[role]}"} if role else {}
        kwargs = {"headers": headers, **extra}
        if json is not None:
            kwargs.update(data=json, content_type="application/json")
        return getattr(client, method)(f"/api{path}", **kwargs)

    return call


# --- browser tests (test_browser*.py): Debian's chromium through Playwright ---------------------


CHROMIUM = os.environ.get("PHALANX_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SHOTS = REPO / "artifacts" / "screenshots"


def chromium_required(path: str) -> None:
    """Fail (at collection) when Debian's chromium is missing: ``make test`` installs it, and a
    browser test skipped for want of a browser would pass without checking anything."""
    if not shutil.which(path) and not Path(path).exists():
        pytest.fail(
            f"no Chromium at {path}: run `make browser` (apt-get install -y chromium)",
            pytrace=False,
        )


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


# Points Plotly has drawn: the vertices of the chart's SVG line paths (what a person sees).
DRAWN_POINTS = """(id) => [...document.querySelectorAll('#' + id + ' path.js-line')]
    .map(p => (p.getAttribute('d') || '').split(/[ML]/).filter(Boolean).length)
    .reduce((a, b) => a + b, 0)"""


def browser_marks() -> list:
    """``pytestmark`` of a browser test module: e2e. Without Debian's chromium the module fails
    to collect (``make test`` installs it): a browser test that is skipped proves nothing."""
    chromium_required(CHROMIUM)
    return [pytest.mark.e2e]


BROWSER_PASSWORD = "browser-test-pw"  # every browser test's users log in with it
# ``manage.py shell`` code that makes the users browser tests log in as (admin, operator, viewer)
BROWSER_USERS_SETUP = f"""
from django.contrib.auth import get_user_model
from console.lib.access import user_set_role
from console.models import Role
users = get_user_model()
users.objects.create_superuser("admin", password={BROWSER_PASSWORD!r})
for role in (Role.OPERATOR, Role.VIEWER):
    user_set_role(user=users.objects.create_user(role.value, password={BROWSER_PASSWORD!r}), role=role)
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Headless Chromium for a module's browser tests."""
    from playwright import sync_api

    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page_as(browser, array):
    """``page_as(role)``: a new page logged in as that role (the module's ``array`` fixture, the
    serving array below unless the module has its own, gives the control plane's ``url``)."""
    contexts = []

    def make(role: str):
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(30_000)
        page.goto(f"{array.url}/login/")
        page.fill("input[name=username]", role)
        page.fill("input[name=password]", BROWSER_PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(f"{array.url}/")
        return page

    yield make
    for context in contexts:
        context.close()


class ShellArray:
    """A control plane on a fresh SQLite (``url``) whose database tests change with ``manage.py
    shell`` code (``shell``), playing the control loop's part."""

    def __init__(self, url: str, env: dict[str, str]) -> None:
        self.url, self.env = url, env

    def shell(self, code: str) -> None:
        from tests.support.processes import manage_shell

        manage_shell(self.env, code)


@contextmanager
def shell_array(home: Path, setup: str) -> Iterator[ShellArray]:
    """A ``ShellArray`` under ``PHALANX_HOME=home``, its database set up by ``setup`` (Python
    run in ``manage.py shell``); the control plane stops at the end."""
    from tests.support.processes import control_plane_at_home

    daphne, _token, extra = control_plane_at_home(home, setup=setup)
    try:
        yield ShellArray(daphne.url, extra)
    finally:
        daphne.stop()


# --- the serving array of test_browser.py and test_browser_node_pages.py: a control plane, its
# control loop and one node agent with the bundled model (registered by the tests) -----------

NODE_ID = "node-b1"


@dataclass
class BrowserArray:
    url: str
    token: str
    procs: list[Proc]
    env: dict[str, str] | None = None  # what another process needs to reach its database

    def api(self, method: str, path: str, **kwargs) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"}
        return httpx.request(method, f"{self.url}/api{path}", headers=headers, timeout=10, **kwargs)


@pytest.fixture(scope="module")
def array(tmp_path_factory) -> Iterator[BrowserArray]:
    """daphne + control loop on a fresh SQLite under a temporary PHALANX_HOME."""
    home = tmp_path_factory.mktemp("phalanx-home")
    daphne, token, extra = control_plane_at_home(home, setup=BROWSER_USERS_SETUP + FAST_LOOP)
    loop = spawn([sys.executable, "manage.py", "controlloop"], home / "controlloop.log", env=extra)
    try:
        yield BrowserArray(url=daphne.url, token=token, procs=[daphne, loop], env=extra)
    finally:
        for proc in (loop, daphne):
            proc.stop()


@pytest.fixture(scope="module")
def agent(array, tmp_path_factory) -> Iterator[Proc]:
    """A real node agent with the bundled model (not registered: tests register it), shipping
    its log records to the array."""
    ships = {**(array.env or {}), "PHALANX_LOGS_URL": array.url}
    proc = start_node(NODE_ID, tmp_path_factory.mktemp("node-logs"), env=ships)
    yield proc
    proc.stop()


@pytest.fixture
def healthy_node(array, agent) -> str:
    """The agent registered, up and validated by the array's control loop (registered through
    the API if a test has not already)."""
    address = agent.url.removeprefix("http://")
    body = {"node_id": NODE_ID, "address": address, "package": PACKAGE}
    if array.api("GET", f"/nodes/{NODE_ID}").status_code == 404:
        assert array.api("PUT", f"/nodes/{NODE_ID}", json=body).status_code in (200, 201)
    array.api("POST", f"/nodes/{NODE_ID}/undrain")
    deadline = time.monotonic() + 120
    while True:
        node = array.api("GET", f"/nodes/{NODE_ID}").json()
        if node["state"] == "up" and node["validation"] in ("passed", "warned"):
            return NODE_ID
        assert time.monotonic() < deadline, f"node did not come up validated: {node}"
        time.sleep(0.3)
