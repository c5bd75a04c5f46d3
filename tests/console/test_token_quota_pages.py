"""Quotas on the Tokens page: each row says the token's limits in force; an admin edits a
token's quota and each role's default in a form (errors next to the field); others cannot."""

from __future__ import annotations

import re
from html import unescape

import pytest

from console.models import Role
from inference.models import Quota
from inference.tokens import token_issue
from inference.usage.quotas import quota_set, quota_values
from tests.console.test_pages import visible_text

pytestmark = pytest.mark.django_db

BLANK = dict.fromkeys(Quota.LIMITS, "")


@pytest.fixture
def ci_agent(db):
    return token_issue(name="ci-agent", role=Role.VIEWER)[0]


def row_text(response, first_cell: str) -> str:
    """The words of the table row whose first cell is ``first_cell``."""
    for row in re.findall(r"<tr>(.*?)</tr>", response.content.decode(), flags=re.S):
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)
        if cells and unescape(re.sub(r"<[^>]+>", "", cells[0])).strip() == first_cell:
            return " ".join(unescape(re.sub(r"<[^>]+>", " ", row)).split())
    raise AssertionError(f"no row {first_cell!r}")


def field_errors(response, name: str) -> list[str]:
    """The error messages shown in the label of the form field ``name``."""
    html = response.content.decode()
    label = re.search(
        rf'<label>(?:(?!</label>).)*name="{name}"(?:(?!</label>).)*</label>', html, re.S
    )
    assert label, f"no field {name}"
    return [unescape(e) for e in re.findall(r'<span class="error">(.*?)</span>', label.group(0))]


def test_an_admin_sets_a_tokens_quota_and_its_row_shows_it(login, ci_agent):
    admin = login("admin")
    assert "no limits" in row_text(admin.get("/tokens/"), "ci-agent")
    form = admin.get(f"/tokens/{ci_agent.pk}/quota/")
    assert "Quota of token ci-agent" in visible_text(form)
    assert "A limit left blank takes the token's role default" in visible_text(form)
    body = BLANK | {"requests_per_minute": "60", "tokens_per_day": "10000", "priority": "7"}
    saved = admin.post(f"/tokens/{ci_agent.pk}/quota/", body, follow=True)
    assert saved.redirect_chain[-1][0] == "/tokens/"
    assert "Saved the quota of token ci-agent: 60 req/min · 10k tok/day · prio 7." in visible_text(
        saved
    )
    row = row_text(saved, "ci-agent")
    assert "60 req/min · 10k tok/day · prio 7" in row
    assert quota_values(token_id=ci_agent.pk)["priority"] == 7


def test_a_role_default_shows_on_its_tokens_and_a_blank_limit_inherits_it(login, ci_agent):
    other = token_issue(name="ops-bot", role=Role.OPERATOR)[0]
    admin = login("admin")
    page = admin.post(
        "/tokens/roles/viewer/quota/", BLANK | {"requests_per_minute": "30"}, follow=True
    )
    assert "Saved the quota of the viewer role's default: 30 req/min." in visible_text(page)
    assert row_text(page, "viewer").startswith("viewer 30 req/min")  # the role defaults table
    assert "30 req/min" in row_text(page, "ci-agent")
    assert "no limits" in row_text(page, other.name)
    form = admin.get(f"/tokens/{ci_agent.pk}/quota/").content.decode()
    assert 'placeholder="blank: viewer default, 30"' in form
    admin.post(f"/tokens/{ci_agent.pk}/quota/", BLANK | {"requests_per_minute": "90"})
    assert "90 req/min" in row_text(admin.get("/tokens/"), "ci-agent")
    admin.post(f"/tokens/{ci_agent.pk}/quota/", BLANK)  # blank again: the role's
    assert "30 req/min" in row_text(admin.get("/tokens/"), "ci-agent")
    admin.post(f"/tokens/{ci_agent.pk}/quota/", BLANK | {"requests_per_minute": "0"})
    assert "no limits" in row_text(admin.get("/tokens/"), "ci-agent")  # 0: none, over the role's


def test_the_form_shows_what_is_stored(login, ci_agent):
    quota_set(changes={"concurrent_sessions": 4, "max_tokens": 512}, token_id=ci_agent.pk)
    admin = login("admin")
    html = admin.get(f"/tokens/{ci_agent.pk}/quota/").content.decode()
    assert re.search(r'name="concurrent_sessions"[^>]*value="4"', html)
    assert re.search(r'name="max_tokens"[^>]*value="512"', html)
    assert "4 sessions · max_tokens 512" in row_text(admin.get("/tokens/"), "ci-agent")
    assert "In force now: 4 sessions · max_tokens 512" in visible_text(
        admin.get(f"/tokens/{ci_agent.pk}/quota/")
    )


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("priority", "12", "priority: must be between 0 and 9."),
        ("tokens_per_minute", "-5", "tokens_per_minute: must be between 0 and 2147483647."),
        ("requests_per_minute", "many", "Enter a whole number."),
    ],
)
def test_a_bad_value_is_shown_next_to_its_field_and_nothing_is_saved(
    login, ci_agent, field, value, says
):
    admin = login("admin")
    page = admin.post(f"/tokens/{ci_agent.pk}/quota/", BLANK | {"max_tokens": "64", field: value})
    assert page.status_code == 200
    assert field_errors(page, field) == [says]
    assert field_errors(page, "max_tokens") == []
    assert quota_values(token_id=ci_agent.pk)["max_tokens"] is None
    role_page = admin.post("/tokens/roles/viewer/quota/", BLANK | {field: value})
    assert field_errors(role_page, field) == [says]


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_only_admins_see_or_change_quotas(login, ci_agent, role):
    client = login(role)
    for path in (f"/tokens/{ci_agent.pk}/quota/", "/tokens/roles/viewer/quota/", "/tokens/"):
        assert client.get(path).status_code == 403
        assert client.post(path, BLANK | {"requests_per_minute": "1"}).status_code == 403
    assert quota_values(token_id=ci_agent.pk)["requests_per_minute"] is None
    assert quota_values(role="viewer")["requests_per_minute"] is None


def test_an_unknown_token_or_role_is_not_found(login):
    admin = login("admin")
    assert admin.get("/tokens/999/quota/").status_code == 404
    assert admin.get("/tokens/roles/root/quota/").status_code == 404
    assert admin.post("/tokens/roles/root/quota/", BLANK).status_code == 404
    assert not Quota.objects.exists()
