from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from console.lib.access import user_set_role
from console.models import Role
from inference.models import ModelPackage
from inference.tokens import token_issue
from nodes.models import Node

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


def browser_marks() -> list:
    """``pytestmark`` of a browser test module: e2e. Without Debian's chromium the module fails
    to collect (``make test`` installs it): a browser test that is skipped proves nothing."""
    from tests.console.test_browser import CHROMIUM, chromium_required

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

    from tests.console.test_browser import CHROMIUM, CHROMIUM_ARGS

    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page_as(browser, array):
    """``page_as(role)``: a new page logged in as that role (the module's ``array`` fixture
    gives the control plane's ``url``)."""
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
