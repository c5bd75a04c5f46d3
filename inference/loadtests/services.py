"""Load-test services: scenarios, starting and stopping runs, the cost model, capacity plans.

A page, the API or a command calls these; none runs load itself (a run is a job:
``inference.loadtests.jobs``). Errors (``console.lib.errors``): ``Invalid`` (422, naming the
field), ``NotFound`` (404), ``Conflict`` (409: a built-in scenario edited, a finished run
stopped). Every change is audited.
"""

from __future__ import annotations

import ipaddress
import math
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.lib.audit import audit_record, current_actor
from console.lib.errors import Conflict, Invalid, NotFound
from inference.loadtests import analysis, identity
from inference.loadtests.models import CostModel, LoadScenario, LoadTestRun
from inference.loadtests.scenario import (
    BUILTIN,
    BadScenario,
    Scenario,
    parse_scenario,
    scenario_from_yaml,
)

State = LoadTestRun.State
MAX_SCENARIOS = 500  # saved ones: every page and form that lists them stays bounded


def _invalid(exc: BadScenario) -> Invalid:
    return Invalid(str(exc), field=exc.field, code="invalid_scenario")


def scenarios_ensure_builtin() -> None:
    """Write the built-in scenarios (``scenario.BUILTIN``) as the code has them now."""
    stored = {s.name: s.spec for s in LoadScenario.objects.filter(name__in=list(BUILTIN))}
    for name, spec in BUILTIN.items():
        if stored.get(name) != spec:
            LoadScenario.objects.update_or_create(
                name=name, defaults={"kind": spec["kind"], "spec": spec, "builtin": True}
            )


def scenario_list() -> list[LoadScenario]:
    scenarios_ensure_builtin()
    return list(LoadScenario.objects.all())


def scenario_get(name: str) -> LoadScenario:
    """The stored scenario ``name`` (built-ins included). Raises ``NotFound``."""
    if name in BUILTIN:
        scenarios_ensure_builtin()
    found = LoadScenario.objects.filter(name=name).first()
    if found is None:
        raise NotFound(f"No load-test scenario {name!r}.", code="scenario_not_found")
    return found


def scenario_parse(*, spec: dict[str, Any] | None = None, yaml_text: str | None = None) -> Scenario:
    """A checked scenario from a mapping or YAML text; ``Invalid`` naming the field."""
    try:
        return scenario_from_yaml(yaml_text) if yaml_text is not None else parse_scenario(spec)
    except BadScenario as exc:
        raise _invalid(exc) from exc


@transaction.atomic
def scenario_save(
    *, spec: dict[str, Any] | None = None, yaml_text: str | None = None
) -> LoadScenario:
    """Create or replace the scenario the spec names. ``Invalid`` for a bad field,
    ``Conflict`` for a built-in's name or a new one past ``MAX_SCENARIOS``."""
    scenario = scenario_parse(spec=spec, yaml_text=yaml_text)
    if scenario.name in BUILTIN:
        raise Conflict(
            f"{scenario.name!r} is built in; save your version under another name.",
            code="scenario_builtin",
            field="name",
        )
    saved = LoadScenario.objects.filter(builtin=False)
    if saved.count() >= MAX_SCENARIOS and not saved.filter(name=scenario.name).exists():
        raise Conflict(
            f"At most {MAX_SCENARIOS} saved scenarios; delete one before saving another.",
            code="scenarios_full",
            field="name",
        )
    row, created = LoadScenario.objects.update_or_create(
        name=scenario.name,
        defaults={"kind": scenario.kind, "spec": scenario.as_spec(), "builtin": False},
    )
    if created:
        row.created_by = current_actor()[:150]
        row.save(update_fields=["created_by"])
    audit_record(
        action="loadtest.scenario." + ("create" if created else "update"),
        target=f"scenario:{scenario.name}",
    )
    return row


def scenario_delete(*, name: str) -> None:
    row = scenario_get(name)
    if row.builtin:
        raise Conflict(f"{name!r} is built in and cannot be deleted.", code="scenario_builtin")
    row.delete()
    audit_record(action="loadtest.scenario.delete", target=f"scenario:{name}")


def _checked_target(url: str | None, token: str) -> str:
    """A target base URL (``http(s)://host:port``; a trailing ``/v1`` is dropped); default:
    this array's own. ``Invalid`` for another shape, a target that is not registered, or one
    off this machine without a token of its own (this array's token never leaves it)."""
    url = (url or "").strip().rstrip("/").removesuffix("/v1") or settings.LOADTEST_TARGET_URL
    try:
        parts = urlsplit(url)
        port = _port(parts)
    except ValueError as exc:
        raise Invalid(f"target_url: {exc} in {url[:100]!r}.", field="target_url") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Invalid(
            f"target_url: an http(s) base URL such as http://127.0.0.1:8000, not {url[:100]!r}.",
            field="target_url",
        )
    if parts.path.rstrip("/") or parts.query:
        raise Invalid(
            "target_url: the base URL only, without a path (the run adds /v1).",
            field="target_url",
        )
    own = _same_place(parts, settings.LOADTEST_TARGET_URL) or _loopback(parts.hostname)
    if not own and not _registered_node(parts.hostname, port):
        raise Invalid(
            f"target_url: {parts.hostname}:{port} is not a registered target: this array's "
            "own URL, a loopback address, or the address of a registered node.",
            field="target_url",
            code="target_not_registered",
        )
    if not token:
        _proven_own(url)
    return url


def _proven_own(url: str) -> None:
    """A run with no token of its own gets one the worker mints, and that token goes only to
    this control plane, proven (``identity.prove``): ``Invalid`` naming ``token`` for any
    other target, loopback or not."""
    try:
        identity.prove(url)
    except (identity.NotThisControlPlane, OSError) as exc:
        raise Invalid(
            f"token: {url} did not prove it is this control plane ({exc}); the run mints a "
            "token only for this array's own control plane. Give the target a token of its own.",
            field="token",
            code="token_needed",
        ) from exc


def _port(parts) -> int:
    return parts.port or (443 if parts.scheme == "https" else 80)


def _loopback(host: str) -> bool:
    """A loopback address written as such (``localhost`` or a literal IP): a name that merely
    starts with 127. is not one."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _same_place(parts, url: str) -> bool:
    other = urlsplit(url)
    return (parts.hostname, _port(parts)) == (other.hostname, _port(other))


def _registered_node(host: str, port: int) -> bool:
    """An external server registered as a node: load goes only where the operator already
    sends traffic, never to any host."""
    from nodes.models import Node

    return Node.objects.filter(address=f"{host}:{port}").exists()


def loadtest_start(
    *,
    scenario: str | None = None,
    spec: dict[str, Any] | None = None,
    target_url: str | None = None,
    token: str = "",
    profile: bool = False,
    claim_pid: int | None = None,
) -> LoadTestRun:
    """Queue a run of the stored scenario ``scenario`` (or of an unsaved ``spec``) against
    ``target_url`` (default: this array's own URL); ``token``: a Bearer token for the target
    (empty: the worker mints one, which only this control plane, proven, may receive: any
    other target without a token is ``Invalid`` naming ``token``). The control loop starts it
    in a worker; runs go one at a time, in order. ``claim_pid``: the run is created already
    running in that process (``manage.py loadtest``), which ``Conflict`` refuses while
    another run is running. Raises ``NotFound``, ``Invalid``, ``Conflict``."""
    if spec is not None:
        checked = scenario_parse(spec=spec)
    elif scenario:
        checked = scenario_parse(spec=scenario_get(scenario).spec)
    else:
        raise Invalid("scenario: name a stored scenario or give a spec.", field="scenario")
    if len(token) > 300:
        raise Invalid("token: at most 300 characters.", field="token")
    target = _checked_target(target_url, token.strip())  # may ask the target: no transaction
    return _run_create(
        checked, target=target, token=token.strip(), profile=profile, claim_pid=claim_pid
    )


@transaction.atomic
def _run_create(
    checked: Scenario, *, target: str, token: str, profile: bool, claim_pid: int | None
) -> LoadTestRun:
    claimed: dict[str, Any] = {}
    if claim_pid is not None:
        busy = LoadTestRun.objects.select_for_update().filter(state=State.RUNNING).first()
        if busy is not None:
            raise Conflict(
                f"Load test {busy.pk} is running; two runs would measure each other. Wait for "
                "it or stop it.",
                code="loadtest_running",
            )
        now = timezone.now()
        claimed = {
            "state": State.RUNNING,
            "attempts": 1,
            "pid": claim_pid,
            "started_at": now,
            "heartbeat_at": now,
        }
    run = LoadTestRun.objects.create(
        **claimed,
        scenario_name=checked.name,
        scenario=checked.as_spec(),
        target_url=target,
        target_token=token,
        profile=profile,
        message="queued: the control loop starts it",
        created_by=current_actor()[:150],
    )
    audit_record(
        action="loadtest.start",
        target=f"loadtest:{run.pk}",
        changes=[f"scenario: {checked.name}", f"target: {target}"],
    )
    return run


def loadtest_get(run_id: int) -> LoadTestRun:
    run = LoadTestRun.objects.filter(pk=run_id).first()
    if run is None:
        raise NotFound(f"No load-test run {run_id}.", code="loadtest_not_found")
    return run


def loadtest_stop(*, run_id: int) -> LoadTestRun:
    """Ask a run to stop: a running one stops within a second or two and keeps what it
    measured (its report covers the finished turns); a queued one ends at once. Raises
    ``Conflict`` for a finished run."""
    run = loadtest_get(run_id)
    if run.finished:
        raise Conflict(f"Load test {run_id} has already {run.state}.", code="loadtest_finished")
    ended = LoadTestRun.objects.filter(pk=run_id, state=State.QUEUED).update(
        state=State.STOPPED,
        cancel_requested=True,
        message="stopped before it began",
        finished_at=timezone.now(),
    )
    if ended:
        from inference.loadtests.credentials import run_tokens_revoke
        from inference.loadtests.jobs import report_write

        run_tokens_revoke(run_id)  # a run queued to resume may hold its dead attempt's token
        report_write(run_id)  # a run queued to resume keeps what its finished steps measured
    else:
        LoadTestRun.objects.filter(pk=run_id, state=State.RUNNING).update(
            cancel_requested=True, message="stopping"
        )
    audit_record(action="loadtest.stop", target=f"loadtest:{run_id}")
    run.refresh_from_db()
    return run


MAX_COST_INPUT = 1e9


def _amount(value: Any) -> bool:
    """A cost input: a finite number from 0 to ``MAX_COST_INPUT`` (an infinite or NaN one
    would make every report invalid JSON)."""
    return (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and math.isfinite(value)
        and 0 <= value <= MAX_COST_INPUT
    )


def cost_model_update(*, changes: dict[str, Any]) -> CostModel:
    """Change the cost model's inputs (any subset of ``CostModel.FIELDS`` and ``currency``);
    ``Invalid`` for an unknown field, a negative number or a zero amortization."""
    model = CostModel.load()
    for field, value in changes.items():
        if field == "currency":
            if not isinstance(value, str) or not 1 <= len(value.strip()) <= 8:
                raise Invalid("currency: 1 to 8 characters.", field="currency")
            model.currency = value.strip()
            continue
        if field not in CostModel.FIELDS:
            raise Invalid(f"{field}: not a cost input.", field=field)
        if not _amount(value):
            raise Invalid(f"{field}: a number from 0 to {MAX_COST_INPUT:g}.", field=field)
        if field == "amortization_months" and value <= 0:
            raise Invalid("amortization_months: more than 0.", field=field)
        setattr(model, field, float(value))
    model.save()
    audit_record(
        action="loadtest.cost_model",
        target="cost-model",
        changes=[f"{k}: {v}" for k, v in changes.items()],
    )
    return model


def loadtest_capacity(
    *,
    run_id: int,
    sessions: int,
    target_p95_s: float | None = None,
    costs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The capacity plan of a finished run's report for ``sessions`` concurrent sessions at
    ``target_p95_s`` (default: the scenario's), with the stored cost model or ``costs``
    overriding some of its inputs. Raises ``Conflict`` when the run has no report yet,
    ``Invalid`` for a count or target out of range."""
    run = loadtest_get(run_id)
    if not run.report:
        raise Conflict(f"Load test {run_id} has no report yet.", code="loadtest_no_report")
    if not 1 <= sessions <= 10_000_000:
        raise Invalid("sessions: 1 to 10,000,000 concurrent sessions.", field="sessions")
    target = target_p95_s if target_p95_s is not None else run.report["summary"]["target_p95_s"]
    if not math.isfinite(target) or not 0 < target <= 600:
        raise Invalid("target_p95_s: more than 0 and at most 600 seconds.", field="target_p95_s")
    inputs = CostModel.load().inputs().as_dict()
    for field, value in (costs or {}).items():
        if field not in inputs:
            raise Invalid(f"costs.{field}: not a cost input.", field=f"costs.{field}")
        if not _amount(value):
            raise Invalid(
                f"costs.{field}: a number from 0 to {MAX_COST_INPUT:g}.", field=f"costs.{field}"
            )
        inputs[field] = float(value)
    if inputs["amortization_months"] <= 0:
        raise Invalid("costs.amortization_months: more than 0.", field="costs.amortization_months")
    summary = run.report["summary"]
    plan = analysis.capacity_plan(
        rows=run.report["steps"],
        nodes_in_run=summary["nodes"],
        sessions=sessions,
        target_p95_s=target,
        costs=analysis.CostInputs(**inputs),
    )
    plan["currency"] = CostModel.load().currency
    return plan
