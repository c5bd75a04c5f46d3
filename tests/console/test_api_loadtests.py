"""The load-test REST API and pages without traffic: scenarios, queueing and stopping runs,
the cost model, capacity plans from a stored report, roles, and the errors a client reads."""

from __future__ import annotations

import pytest

from inference.loadtests.analysis import CostInputs
from inference.loadtests.models import CostModel, LoadTestRun
from inference.loadtests.report import build_report
from inference.loadtests.scenario import parse_scenario
from tests.console.test_pages import visible_text
from tests.inference.loadtests.synthetic import curve

pytestmark = pytest.mark.django_db

TINY = {"name": "tiny", "kind": "agent_sessions", "steps": [1, 2], "turns": 2}


@pytest.fixture(autouse=True)
def own_target_proves(monkeypatch):
    """No control plane listens on this array's own URL in these tests: let that one prove
    it is ours (``identity.prove``); every other target is asked for real."""
    from django.conf import settings

    from inference.loadtests import identity

    real = identity.prove

    def prove(url, **kwargs):
        if url == settings.LOADTEST_TARGET_URL:
            return identity.Proven(pid=1, address=("127.0.0.1", 8000))
        return real(url, **kwargs)

    monkeypatch.setattr(identity, "prove", prove)


@pytest.fixture
def finished(db) -> LoadTestRun:
    """A run with a report: knee at 4 of 8 on one node."""
    scenario = parse_scenario({"name": "done", "kind": "agent_sessions", "steps": [2, 4, 8]})
    turns, sessions, steps = curve([(2, 0.1, 40), (4, 0.2, 80), (8, 0.9, 90)])
    report = build_report(
        scenario=scenario,
        target="http://127.0.0.1:8000",
        state="succeeded",
        turns=turns,
        sessions=sessions,
        steps=steps,
        samples=[],
        costs=CostInputs(),
    )
    return LoadTestRun.objects.create(
        scenario_name="done",
        scenario=scenario.as_spec(),
        target_url="http://127.0.0.1:8000",
        state="succeeded",
        turns=turns,
        sessions=sessions,
        steps_done=steps,
        report=report,
        progress=1.0,
    )


def test_it_lists_the_builtin_scenarios(api):
    names = [s["name"] for s in api("viewer", "get", "/loadtests/scenarios").json()]
    assert {"ramp-quick", "agent-sessions-quick", "agent-sessions"} <= set(names)
    yaml = api("viewer", "get", "/loadtests/scenarios/ramp-quick/yaml")
    assert yaml.status_code == 200 and "kind: ramp" in yaml.content.decode()


def test_it_saves_a_yaml_scenario_and_names_a_bad_field(api):
    saved = api(
        "operator",
        "post",
        "/loadtests/scenarios",
        json={"yaml": "name: mine\nkind: ramp\nsteps: [1, 3]\nhold_s: 5\n"},
    )
    assert saved.status_code == 201 and saved.json()["spec"]["steps"] == [1, 3]
    bad = api(
        "operator",
        "post",
        "/loadtests/scenarios",
        json={"spec": {"name": "mine", "kind": "ramp", "steps": [1], "hold_s": 0}},
    )
    assert bad.status_code == 422
    assert bad.json() == {
        "detail": "hold_s: must be between 1 and 3600, not 0",
        "code": "invalid_scenario",
        "field": "hold_s",
    }
    builtin = api(
        "operator", "post", "/loadtests/scenarios", json={"spec": {**TINY, "name": "ramp-quick"}}
    )
    assert builtin.status_code == 409 and builtin.json()["code"] == "scenario_builtin"
    assert api("viewer", "post", "/loadtests/scenarios", json={"spec": TINY}).status_code == 403


def test_it_queues_a_run_and_stops_it_before_it_starts(api):
    started = api("operator", "post", "/loadtests", json={"spec": TINY})
    assert started.status_code == 201
    run = started.json()
    assert run["state"] == "queued" and run["target_url"] == "http://127.0.0.1:8000"
    assert "token" not in run
    stopped = api("operator", "post", f"/loadtests/{run['id']}/stop")
    assert stopped.json()["state"] == "stopped"
    again = api("operator", "post", f"/loadtests/{run['id']}/stop")
    assert again.status_code == 409 and again.json()["code"] == "loadtest_finished"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"scenario": "nope"}, None),
        ({"spec": TINY, "target_url": "ftp://example"}, "target_url"),
        ({"spec": TINY, "target_url": "http://127.0.0.1:8000/v1/chat"}, "target_url"),
        ({}, "scenario"),
        ({"spec": TINY, "target_url": "http://203.0.113.9:8000"}, "target_url"),
        ({"spec": TINY, "target_url": "http://127.0.0.1.attacker.example:80"}, "target_url"),
        ({"spec": TINY, "target_url": "http://127.0.0.1:99999"}, "target_url"),
        ({"spec": TINY, "target_url": "http://[::1"}, "target_url"),
    ],
)
def test_it_refuses_a_bad_run_with_a_message(api, body, field):
    answer = api("operator", "post", "/loadtests", json=body)
    assert answer.status_code in (404, 422)
    assert answer.json()["field"] == field and answer.json()["detail"]


def test_it_keeps_the_token_for_another_target_out_of_every_answer(api):
    run = api(
        "operator",
        "post",
        "/loadtests",
        json={"spec": TINY, "target_url": "http://127.0.0.12:9000", "token": "sk-secret"},
    )
    assert "sk-secret" not in run.content.decode()
    assert "sk-secret" not in api("viewer", "get", "/loadtests").content.decode()
    assert LoadTestRun.objects.get(pk=run.json()["id"]).target_token == "sk-secret"


def test_it_plans_capacity_from_a_report(api, finished):
    plan = api(
        "viewer",
        "post",
        f"/loadtests/{finished.pk}/capacity",
        json={"sessions": 100, "target_p95_s": 0.3},
    ).json()
    assert plan["sessions_per_node"] == 4.0 and plan["nodes_needed"] == 25
    looser = api(
        "viewer",
        "post",
        f"/loadtests/{finished.pk}/capacity",
        json={"sessions": 100, "target_p95_s": 1.0},
    ).json()
    assert looser["nodes_needed"] == 13  # 8 a node
    cheaper = api(
        "viewer",
        "post",
        f"/loadtests/{finished.pk}/capacity",
        json={"sessions": 100, "costs": {"hardware_cost": 0}},
    ).json()
    assert cheaper["node_month"]["hardware"] == 0
    bad = api("viewer", "post", f"/loadtests/{finished.pk}/capacity", json={"sessions": 0})
    assert bad.status_code == 422 and bad.json()["field"] == "sessions"


def test_it_exports_the_report_as_json_and_csv(api, finished):
    body = api("viewer", "get", f"/loadtests/{finished.pk}/report?download=true")
    assert "attachment" in body["Content-Disposition"]
    assert body.json()["summary"]["knee_concurrency"] == 4
    odd = api("viewer", "get", f"/loadtests/{finished.pk}/report.csv?rows=a%0Ab")
    assert odd.status_code == 422 and odd.json()["field"] == "rows"
    steps = api("viewer", "get", f"/loadtests/{finished.pk}/report.csv").content.decode()
    assert steps.splitlines()[0].startswith("concurrency,requests,errors")
    assert len(steps.strip().splitlines()) == 4
    queued = api("operator", "post", "/loadtests", json={"spec": TINY}).json()
    assert api("viewer", "get", f"/loadtests/{queued['id']}/report").status_code == 409


def test_it_changes_the_cost_model_and_refuses_nonsense(api):
    changed = api(
        "operator", "put", "/loadtests-cost-model", json={"power_w": 120, "currency": "EUR"}
    )
    assert changed.json()["power_w"] == 120 and CostModel.load().currency == "EUR"
    bad = api("operator", "put", "/loadtests-cost-model", json={"amortization_months": 0})
    assert bad.status_code == 422 and bad.json()["field"] == "amortization_months"
    for value in ("inf", "nan", 1e308):
        bad = api("operator", "put", "/loadtests-cost-model", json={"power_w": value})
        assert bad.status_code == 422 and bad.json()["field"] == "power_w", value
    assert api("viewer", "put", "/loadtests-cost-model", json={"power_w": 1}).status_code == 403


def test_the_report_page_shows_the_knee_plan_and_findings(login, finished):
    page = login("viewer").get(f"/loadtests/{finished.pk}/?sessions=100&target_p95_s=0.3")
    text = visible_text(page)
    assert "Knee 4 sessions" in text
    assert "Nodes needed 25" in text
    assert "No findings" in text
    assert "Stop" not in text  # finished, and a viewer
    for odd in ("abc", "²", "-1", "99999999999999999999999"):
        assert login("viewer").get(f"/loadtests/{finished.pk}/?overlay={odd}").status_code == 200


def test_the_list_page_shows_runs_and_only_operators_start_one(login, finished):
    viewer = visible_text(login("viewer").get("/loadtests/"))
    assert "done" in viewer and "agent-sessions-quick" in viewer
    assert "Start a load test" not in viewer
    operator = login("operator")
    assert "Start a load test" in visible_text(operator.get("/loadtests/"))
    started = operator.post("/loadtests/", {"form": "start", "run-scenario": "ramp-quick"})
    assert started.status_code == 302
    run = LoadTestRun.objects.order_by("-pk").first()
    assert run.scenario_name == "ramp-quick" and run.state == "queued"
    refused = login("viewer").post("/loadtests/", {"form": "start", "run-scenario": "ramp-quick"})
    assert refused.status_code == 403


def test_it_accepts_a_registered_external_node_as_a_target(api, package):
    from nodes.models import Node

    Node.objects.create(node_id="gpu-box", address="203.0.113.7:8080", package=package)
    run = api(
        "operator",
        "post",
        "/loadtests",
        json={"spec": TINY, "target_url": "http://203.0.113.7:8080", "token": "t"},
    )
    assert run.status_code == 201, run.json()
    other = api(
        "operator",
        "post",
        "/loadtests",
        json={"spec": TINY, "target_url": "http://203.0.113.7:9999"},
    )
    assert other.status_code == 422
    assert "is not a registered target" in other.json()["detail"]


def test_a_headless_run_is_refused_while_another_runs(finished):
    from console.lib.errors import Conflict
    from inference.loadtests import services

    LoadTestRun.objects.filter(pk=finished.pk).update(state="running")
    with pytest.raises(Conflict) as caught:
        services.loadtest_start(spec=TINY, claim_pid=12345)
    assert f"Load test {finished.pk} is running" in caught.value.message
    LoadTestRun.objects.filter(pk=finished.pk).update(state="succeeded")
    run = services.loadtest_start(spec=TINY, claim_pid=12345)
    assert run.state == "running" and run.attempts == 1 and run.pid == 12345


def test_it_names_a_misspelt_field_instead_of_ignoring_it(api):
    typo = api("operator", "post", "/loadtests", json={"spec": TINY, "target_token": "x"})
    assert typo.status_code == 422 and typo.json()["field"] == "target_token"
    assert not LoadTestRun.objects.exists()
    both = api(
        "operator",
        "post",
        "/loadtests/scenarios",
        json={"spec": TINY, "yaml": "name: y\nsteps: [1]\n"},
    )
    assert both.status_code == 422 and "one of them" in both.json()["detail"]
    neither = api("operator", "post", "/loadtests/scenarios", json={})
    assert neither.status_code == 422 and "one of them" in neither.json()["detail"]


def test_a_loopback_stranger_with_no_token_is_refused_naming_token_and_gets_none(api, login):
    from tests.inference.loadtests.throwaway import stranger_server

    with stranger_server() as stranger:
        answer = api(
            "operator", "post", "/loadtests", json={"spec": TINY, "target_url": stranger.url}
        )
        page = login("operator").post(
            "/loadtests/",
            {"form": "start", "run-scenario": "ramp-quick", "run-target_url": stranger.url},
        )
    assert answer.status_code == 422
    assert answer.json()["field"] == "token" and answer.json()["code"] == "token_needed"
    assert "did not prove it is this control plane" in answer.json()["detail"]
    assert page.status_code == 422 and "did not prove it is this control plane" in visible_text(
        page
    )
    assert stranger.credentials() == [] and not LoadTestRun.objects.exists()
    from inference.models import ApiToken

    assert not ApiToken.objects.filter(name__startswith="load test").exists()
    with_token = api(
        "operator",
        "post",
        "/loadtests",
        json={"spec": TINY, "target_url": stranger.url, "token": "its-own"},
    )
    assert with_token.status_code == 201  # its own token goes where the operator sends it


DEEP = "name: deep\nsteps: [1]\nturns: " + "[" * 3000 + "]" * 3000 + "\n"


def test_a_scenario_nested_3000_deep_is_a_422_naming_yaml_everywhere_it_enters(api, login):
    saved = api("operator", "post", "/loadtests/scenarios", json={"yaml": DEEP})
    assert saved.status_code == 422, saved.content[:300]
    assert saved.json()["field"] == "yaml"
    assert "nested more than 8 levels deep (at line 3)" in saved.json()["detail"]
    page = login("operator").post("/loadtests/", {"form": "scenario", "scenario-yaml": DEEP})
    assert page.status_code == 422 and "nested more than 8 levels deep" in visible_text(page)
    deep_json = '{"spec": {"name": "deep", "steps": [1], "turns": ' + "[" * 3000 + "]" * 3000 + "}}"
    answer = api("operator", "post", "/loadtests", data=deep_json, content_type="application/json")
    assert 400 <= answer.status_code < 500, answer.content[:300]
    long = api("operator", "post", "/loadtests/scenarios", json={"yaml": "# x\n" * 20_000})
    assert long.status_code == 422 and "at most 64,000 characters" in long.json()["detail"]


def test_the_report_page_draws_a_bounded_errors_table_from_a_stored_report(login, finished):
    rows = [
        {"kind": f"http_500 odd-{i}", "count": 1, "share": 0.0001, "example": "x"}
        for i in range(5000)
    ]
    LoadTestRun.objects.filter(pk=finished.pk).update(report={**finished.report, "errors": rows})
    page = login("viewer").get(f"/loadtests/{finished.pk}/")
    text = visible_text(page)
    assert "http_500 odd-18" in text and "http_500 odd-19 " not in text
    assert "other (4981 kinds) 4981" in text
    assert page.content.decode().count("http_500 odd-") == 19


def test_saved_scenarios_are_bounded(api, monkeypatch):
    from inference.loadtests import services

    monkeypatch.setattr(services, "MAX_SCENARIOS", 2)
    for name in ("a", "b"):
        assert (
            api(
                "operator", "post", "/loadtests/scenarios", json={"spec": {**TINY, "name": name}}
            ).status_code
            == 201
        )
    full = api("operator", "post", "/loadtests/scenarios", json={"spec": {**TINY, "name": "c"}})
    assert full.status_code == 409 and full.json()["code"] == "scenarios_full"
    assert "At most 2 saved scenarios" in full.json()["detail"]
    again = api("operator", "post", "/loadtests/scenarios", json={"spec": {**TINY, "name": "a"}})
    assert again.status_code == 201  # replacing one still works
