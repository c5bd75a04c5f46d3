"""The quota API (``/api/quotas``): viewers read, admins set a role's default or a token's
quota; errors name the field; what is set is what the proxy's caller lookup then enforces."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.test import Client

from console.models import AuditEntry, Role
from inference import lookups
from inference.tokens import token_issue

pytestmark = pytest.mark.django_db


@pytest.fixture
def tokens() -> dict[str, tuple[int, str]]:
    """``{role: (token id, plaintext)}``, plus ``ci-agent``, a viewer token."""
    made = {role.value: token_issue(name=f"t-{role.value}", role=role) for role in Role}
    made["ci-agent"] = token_issue(name="ci-agent", role=Role.VIEWER)
    return {name: (token.pk, plaintext) for name, (token, plaintext) in made.items()}


@pytest.fixture
def api(tokens) -> Callable[..., object]:
    """``api(as_token, method, path, json=None)`` with that token's Bearer header."""

    def call(as_token: str | None, method: str, path: str, json: object = None):
        headers = {"Authorization": f"Bearer {tokens[as_token][1]}"} if as_token else {}
        kwargs: dict = {"headers": headers}
        if json is not None:
            kwargs.update(data=json, content_type="application/json")
        return getattr(Client(), method)(f"/api{path}", **kwargs)

    return call


def _row(body: dict, name: str) -> dict:
    return next(t for t in body["tokens"] if t["name"] == name)


def test_it_lists_every_role_and_token_with_nothing_set(api, tokens):
    body = api("viewer", "get", "/quotas").json()
    assert sorted(body["roles"]) == ["admin", "operator", "viewer"]
    assert body["roles"]["viewer"]["requests_per_minute"] is None
    row = _row(body, "ci-agent")
    assert (row["token_id"], row["role"], row["revoked"]) == (
        tokens["ci-agent"][0],
        "viewer",
        False,
    )
    assert row["in_force"] == {
        "requests_per_minute": None,
        "tokens_per_minute": None,
        "tokens_per_day": None,
        "concurrent_sessions": None,
        "max_tokens": None,
        "priority": 5,
    }


def test_a_role_default_reaches_its_tokens_and_a_token_overrides_it(api, tokens):
    role = api(
        "admin",
        "put",
        "/quotas/roles/viewer",
        {"requests_per_minute": 30, "tokens_per_day": 200000},
    )
    assert role.status_code == 200
    assert role.json()["values"]["tokens_per_day"] == 200000
    assert role.json()["in_force"]["requests_per_minute"] == 30
    token_id = tokens["ci-agent"][0]
    own = api(
        "admin", "put", f"/quotas/tokens/{token_id}", {"requests_per_minute": 60, "priority": 7}
    )
    assert own.status_code == 200
    assert own.json()["values"]["requests_per_minute"] == 60
    assert own.json()["values"]["tokens_per_day"] is None  # blank: inherits
    in_force = own.json()["in_force"]
    assert (in_force["requests_per_minute"], in_force["tokens_per_day"], in_force["priority"]) == (
        60,
        200000,
        7,
    )
    listed = api("viewer", "get", "/quotas").json()
    assert _row(listed, "ci-agent")["in_force"] == in_force
    assert _row(listed, "t-viewer")["in_force"]["requests_per_minute"] == 30
    assert _row(listed, "t-admin")["in_force"]["requests_per_minute"] is None
    assert listed["roles"]["viewer"]["requests_per_minute"] == 30


def test_a_body_is_partial_and_null_blanks_a_limit(api, tokens):
    api("admin", "put", "/quotas/roles/viewer", {"tokens_per_day": 1000})
    token_id = tokens["ci-agent"][0]
    api(
        "admin",
        "put",
        f"/quotas/tokens/{token_id}",
        {"requests_per_minute": 60, "tokens_per_day": 0},
    )
    kept = api("admin", "put", f"/quotas/tokens/{token_id}", {"priority": 2}).json()
    assert (kept["values"]["requests_per_minute"], kept["values"]["priority"]) == (60, 2)
    assert kept["in_force"]["tokens_per_day"] is None  # 0: no limit, over the role's 1000
    blanked = api("admin", "put", f"/quotas/tokens/{token_id}", {"tokens_per_day": None}).json()
    assert blanked["values"]["tokens_per_day"] is None
    assert blanked["in_force"]["tokens_per_day"] == 1000  # the role's again


def test_the_token_list_says_each_tokens_limits_in_force(api, tokens):
    api("admin", "put", f"/quotas/tokens/{tokens['ci-agent'][0]}", {"max_tokens": 256})
    listed = api("admin", "get", "/tokens").json()
    quota = next(t for t in listed if t["name"] == "ci-agent")["quota"]
    assert (quota["max_tokens"], quota["priority"], quota["requests_per_minute"]) == (256, 5, None)


def test_what_is_set_is_what_the_proxy_enforces_at_once(api, tokens):
    raw = tokens["ci-agent"][1]
    assert lookups.caller_for_token(raw).limits.requests_per_minute is None  # cached now
    api("admin", "put", f"/quotas/tokens/{tokens['ci-agent'][0]}", {"requests_per_minute": 60})
    assert lookups.caller_for_token(raw).limits.requests_per_minute == 60
    api("admin", "put", "/quotas/roles/viewer", {"concurrent_sessions": 2})
    assert lookups.caller_for_token(raw).limits.concurrent_sessions == 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"priority": 10}, "priority"),
        ({"requests_per_minute": -1}, "requests_per_minute"),
        ({"tokens_per_day": "200k"}, "tokens_per_day"),
        ({"max_tokens": True}, "max_tokens"),
        ({"concurrent_sessions": 1.5}, "concurrent_sessions"),
        ({"requests_per_hour": 5}, "requests_per_hour"),
        ({"concurrent_sessions": 3_000_000_000}, "concurrent_sessions"),  # past an integer column
    ],
)
def test_a_bad_value_is_a_422_naming_its_field_and_changes_nothing(api, tokens, body, field):
    token_id = tokens["ci-agent"][0]
    api("admin", "put", f"/quotas/tokens/{token_id}", {"requests_per_minute": 60})
    for path in (f"/quotas/tokens/{token_id}", "/quotas/roles/viewer"):
        answer = api("admin", "put", path, {"requests_per_minute": 5, **body})
        assert answer.status_code == 422, answer.json()
        assert answer.json()["field"] == field
        assert answer.json()["detail"].startswith(f"{field}:")
    listed = api("admin", "get", "/quotas").json()
    assert _row(listed, "ci-agent")["values"]["requests_per_minute"] == 60
    assert listed["roles"]["viewer"]["requests_per_minute"] is None


def test_an_unknown_token_or_role_is_a_404(api):
    for path, code in [
        ("/quotas/tokens/999", "token_not_found"),
        ("/quotas/tokens/0", "token_not_found"),
        ("/quotas/tokens/99999999999999999999", "token_not_found"),
        ("/quotas/roles/root", "role_not_found"),
    ]:
        answer = api("admin", "put", path, {"priority": 1})
        assert answer.status_code == 404, (path, answer.content)
        assert answer.json()["code"] == code


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_only_admins_set_quotas_and_viewers_read_them(api, tokens, role):
    assert api(role, "get", "/quotas").status_code == 200
    token_id = tokens["ci-agent"][0]
    assert api(role, "put", f"/quotas/tokens/{token_id}", {"priority": 9}).status_code == 403
    assert api(role, "put", "/quotas/roles/viewer", {"priority": 9}).status_code == 403
    assert api(None, "get", "/quotas").status_code == 401
    assert api("admin", "get", "/quotas").json()["roles"]["viewer"]["priority"] is None


def test_each_change_is_audited_with_who_made_it(api, tokens):
    api("admin", "put", f"/quotas/tokens/{tokens['ci-agent'][0]}", {"priority": 7})
    entry = AuditEntry.objects.filter(action="quota.set").latest("pk")
    assert entry.actor == "token:t-admin"
    assert entry.target == f"token:{tokens['ci-agent'][0]}"
    assert entry.changes == ["priority: None -> 7"]
