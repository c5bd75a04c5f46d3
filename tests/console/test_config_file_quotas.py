"""The config file's ``quotas:`` section: roles' defaults and tokens' quotas (by name) applied
through ``quota_set``, exported, round trip idempotent; bad values and names refused naming the
line and path, with nothing changed."""

from __future__ import annotations

import pytest
import yaml

from console.config_file import ConfigError, apply_config_text, export_config
from console.models import AuditEntry, Role
from inference.models import Quota
from inference.tokens import token_issue, token_withdraw
from inference.usage.quotas import limits_for, quota_set, quota_values

pytestmark = pytest.mark.django_db

EXAMPLE = """\
quotas:
  roles:
    viewer: {requests_per_minute: 30, tokens_per_day: 200000}
  tokens:
    ci-agent: {requests_per_minute: 60, priority: 7}
"""


@pytest.fixture
def ci_agent():
    return token_issue(name="ci-agent", role=Role.VIEWER)[0]


def test_it_applies_the_example_of_the_issue(ci_agent):
    report = apply_config_text(EXAMPLE)
    assert report.changed
    assert report.settings_changed == ["quotas.roles.viewer", "quotas.tokens.ci-agent"]
    assert report.changes == [
        "quotas.roles.viewer.requests_per_minute: (none) \u2192 30",
        "quotas.roles.viewer.tokens_per_day: (none) \u2192 200000",
        "quotas.tokens.ci-agent.requests_per_minute: (none) \u2192 60",
        "quotas.tokens.ci-agent.priority: (none) \u2192 7",
    ]
    limits = limits_for(role="viewer", token_id=ci_agent.pk)
    assert (limits.requests_per_minute, limits.tokens_per_day, limits.priority) == (60, 200000, 7)
    assert limits_for(role="viewer").requests_per_minute == 30
    entry = AuditEntry.objects.get(action="config.apply")
    assert "quotas.tokens.ci-agent.priority: (none) \u2192 7" in entry.changes


def test_it_is_idempotent(ci_agent):
    apply_config_text(EXAMPLE)
    records = AuditEntry.objects.count()
    again = apply_config_text(EXAMPLE)
    assert not again.changed and again.changes == []
    assert AuditEntry.objects.count() == records


def test_it_exports_every_role_and_each_token_with_a_quota(ci_agent):
    token_issue(name="no-quota", role=Role.VIEWER)
    apply_config_text(EXAMPLE)
    quotas = yaml.safe_load(export_config())["quotas"]
    assert quotas["roles"]["viewer"] == {
        "requests_per_minute": 30,
        "tokens_per_minute": None,
        "tokens_per_day": 200000,
        "concurrent_sessions": None,
        "max_tokens": None,
        "priority": None,
    }
    assert all(v is None for v in quotas["roles"]["admin"].values())
    assert list(quotas["tokens"]) == ["ci-agent"]
    assert quotas["tokens"]["ci-agent"]["priority"] == 7
    assert quotas["tokens"]["ci-agent"]["tokens_per_day"] is None  # blank: the role's


def test_an_export_applied_changes_nothing_and_restores_what_it_says(ci_agent):
    apply_config_text(EXAMPLE)
    quota_set(changes={"max_tokens": 512, "concurrent_sessions": 0}, role="operator")
    exported = export_config()
    assert not apply_config_text(exported).changed
    quota_set(changes={"priority": 1, "tokens_per_minute": 5}, token_id=ci_agent.pk)
    quota_set(changes={"max_tokens": None}, role="operator")
    quota_set(changes={"requests_per_minute": 999}, role="admin")
    restored = apply_config_text(exported)
    assert "quotas.tokens.ci-agent.tokens_per_minute: 5 \u2192 (none)" in restored.changes
    assert quota_values(token_id=ci_agent.pk)["priority"] == 7
    assert quota_values(role="operator")["max_tokens"] == 512
    assert quota_values(role="admin")["requests_per_minute"] is None
    assert export_config() == exported


def test_null_blanks_a_limit_and_a_limit_left_out_stays(ci_agent):
    apply_config_text(EXAMPLE)
    report = apply_config_text("quotas:\n  tokens:\n    ci-agent: {requests_per_minute: null}\n")
    assert report.changes == ["quotas.tokens.ci-agent.requests_per_minute: 60 \u2192 (none)"]
    assert quota_values(token_id=ci_agent.pk)["priority"] == 7
    assert limits_for(role="viewer", token_id=ci_agent.pk).requests_per_minute == 30  # the role's


def test_a_dry_run_reports_and_writes_nothing(ci_agent):
    report = apply_config_text(EXAMPLE, dry_run=True)
    assert report.dry_run and "quotas.tokens.ci-agent.priority: (none) \u2192 7" in report.changes
    assert not Quota.objects.exists()


@pytest.mark.parametrize(
    ("entry", "line", "field", "says"),
    [
        ("ci-agent: {priority: 10}", 3, "quotas.tokens.ci-agent.priority", "between 0 and 9"),
        (
            "ci-agent: {requests_per_minute: -1}",
            3,
            "quotas.tokens.ci-agent.requests_per_minute",
            "between 0 and",
        ),
        (
            "ci-agent: {tokens_per_day: '200k'}",
            3,
            "quotas.tokens.ci-agent.tokens_per_day",
            "whole number",
        ),
        ("ci-agent: {max_tokens: 1.5}", 3, "quotas.tokens.ci-agent.max_tokens", "whole number"),
        ("ci-agent: {max_tokens: true}", 3, "quotas.tokens.ci-agent.max_tokens", "whole number"),
        (
            "ci-agent: {requests_per_hour: 5}",
            3,
            "quotas.tokens.ci-agent.requests_per_hour",
            "unknown key",
        ),
        ("ci-agent: {priority: [1]}", 3, "quotas.tokens.ci-agent.priority", "single value"),
        ("ci-agent: 5", 3, "quotas.tokens.ci-agent", "must be a mapping"),
        ("ghost: {priority: 1}", 3, "quotas.tokens.ghost", "no token named 'ghost'"),
    ],
)
def test_a_bad_token_entry_names_its_line_and_path_and_changes_nothing(
    ci_agent, entry, line, field, says
):
    text = f"quotas:\n  tokens:\n    {entry}\n  roles:\n    viewer: {{priority: 2}}\n"
    with pytest.raises(ConfigError) as info:
        apply_config_text(text)
    assert (info.value.line, info.value.field) == (line, field)
    assert says in info.value.message
    assert str(info.value).startswith(f"line {line}, {field}: ")
    assert not Quota.objects.exists()  # the role's default, read first, was not kept


@pytest.mark.parametrize(
    ("text", "field", "says"),
    [
        ("quotas:\n  roles:\n    root: {priority: 1}\n", "quotas.roles.root", "unknown key"),
        ("quotas:\n  groups: {}\n", "quotas.groups", "unknown key"),
        ("quotas: [1]\n", "quotas", "must be a mapping"),
    ],
)
def test_a_bad_section_names_its_path(text, field, says):
    with pytest.raises(ConfigError) as info:
        apply_config_text(text)
    assert info.value.field == field and says in info.value.message


def test_a_name_several_tokens_share_is_refused_and_not_exported(ci_agent):
    twin = token_issue(name="ci-agent", role=Role.OPERATOR)[0]
    quota_set(changes={"priority": 3}, token_id=twin.pk)
    with pytest.raises(ConfigError) as info:
        apply_config_text(EXAMPLE)
    assert info.value.field == "quotas.tokens.ci-agent"
    assert f"2 tokens are named 'ci-agent' (ids {ci_agent.pk}, {twin.pk})" in info.value.message
    exported = export_config()
    assert "ci-agent" not in yaml.safe_load(exported)["quotas"]["tokens"]
    assert "# quotas.tokens: not written for ci-agent: several tokens" in exported
    assert not apply_config_text(exported).changed
    token_withdraw(token_id=twin.pk)  # a revoked token no longer shares the name
    assert apply_config_text(EXAMPLE).changed
    assert quota_values(token_id=ci_agent.pk)["priority"] == 7


def test_the_api_names_the_path_of_a_bad_quota(api):
    answer = api(
        "admin", "post", "/config", {"yaml": "quotas:\n  roles:\n    viewer: {priority: 12}\n"}
    )
    assert answer.status_code == 422
    body = answer.json()
    assert (body["line"], body["field"]) == (3, "quotas.roles.viewer.priority")
    assert body["detail"] == "line 3, quotas.roles.viewer.priority: must be between 0 and 9."
    applied = api(
        "admin",
        "post",
        "/config",
        {"yaml": "quotas:\n  tokens:\n    t-viewer: {max_tokens: 256}\n"},
    )
    assert applied.json()["changes"] == ["quotas.tokens.t-viewer.max_tokens: (none) \u2192 256"]
    assert api("viewer", "get", "/config?format=yaml").content.decode().count("t-viewer:") == 1
