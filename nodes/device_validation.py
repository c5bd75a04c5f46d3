"""Device validation in the control plane: a node proves itself before it takes traffic.

A run is a ``ValidationRun`` row the control loop advances (``validation_advance``, every
second, on a thread of its own: a step kind of ``console.lib.steps``): queued -> running (the
node collects its inventory and runs its benchmarks, ``nodes/agent/validation.py``) -> passed | warned | failed (the compatibility
matrix, ``nodes.devices.matrix``, applied here, beside the pool's figures) or error (the run
could not finish; retried with a backoff). Runs start when a node is new or its agent
restarted (``start``), when its inventory's fingerprint changes (``change``, with the diff) and
on demand. While a run is open the node is ``validating`` and routing gives it no traffic; a
pass sets its measured speed (decode tokens/s at 8 sequences over the pool's median), which
scales its routing weight. Every write of a run is conditional on the state it read, so the
loop and ``manage.py validate`` can both advance one run. See docs/validation.md.
"""

from __future__ import annotations

import logging
import os
import threading
from datetime import timedelta
from typing import Any

import httpx
from django.db import transaction
from django.utils import timezone

from console.lib.jobs import hold
from console.lib.steps import StepKind
from nodes import client as node_client
from nodes.devices.inventory import diff
from nodes.devices.matrix import (
    FAIL,
    Facts,
    RuleResult,
    evaluate,
    load_matrix,
    overall,
    pool_rules,
)
from nodes.live import live_node_changed
from nodes.models import Node, NodeEvent, ValidationRun
from nodes.validation_machines import Placement, may_start
from nodes.validation_pool import (
    BENCH_KEYS,
    figure,
    pool_figures,
    pool_note,
    pool_rejudge,
    speeds_refresh,
)

log = logging.getLogger(__name__)
Run = ValidationRun
TIMEOUT_S = float(os.environ.get("PHALANX_VALIDATION_TIMEOUT_S", "300"))
STEP_INTERVAL_S = 1.0
LEASE_S = 30.0  # a control loop that dies mid-step holds its run this long at most
RENEW_S = 10.0  # a step under way renews its lease this often
RETRY_FIRST_S, RETRY_MAX_S = 60.0, 3600.0
_VERDICT = {"pass": Run.State.PASSED, "warn": Run.State.WARNED, "fail": Run.State.FAILED}
_NODE_STATUS = {
    Run.State.PASSED: "passed",
    Run.State.WARNED: "warned",
    Run.State.FAILED: "failed",
    Run.State.ERROR: "failed",
}
OPEN = (Run.State.QUEUED, Run.State.RUNNING)
ENGINE_KEYS = ("threads", "sequences", "ctx_per_seq", "kv_bytes_per_token")


def _placement(node: Node) -> Placement:
    return Placement.of(address=node.address, cpu_set=node.cpu_set)


def _event(node: Node, message: str) -> None:
    event = NodeEvent.objects.create(
        node=node, kind=NodeEvent.Kind.VALIDATION, message=message[:1000], actor="validation"
    )
    live_node_changed(node_id=node.node_id, event=event)


def _age_s(since) -> float:
    return (timezone.now() - since).total_seconds() if since else 0.0


# Requests ---------------------------------------------------------------------------------


@transaction.atomic
def validation_request(
    *, node_id: str, trigger: str, requested_by: str = "", instance: str = ""
) -> ValidationRun:
    """Queue a validation of ``node_id`` (an open run of the node is returned instead); the node
    is ``validating`` (no traffic) until it ends. ``instance``: the agent process it is for,
    when known. Raises ``Node.DoesNotExist``."""
    node = Node.objects.select_for_update().get(node_id=node_id)
    open_run = node.validation_runs.filter(state__in=OPEN).first()
    if open_run is not None:
        return open_run
    run = Run.objects.create(
        node=node,
        trigger=trigger,
        requested_by=requested_by,
        package_id=node.package_id,
        node_instance=instance[:64],
    )
    node.validation = Node.Validation.VALIDATING
    node.validation_reason = f"run {run.pk} ({run.get_trigger_display().lower()}) under way"
    node.save(update_fields=["validation", "validation_reason", "updated_at"])
    _event(node, f"validation {run.pk} queued: {run.get_trigger_display().lower()}")
    return run


def validation_note_probe(*, node_id: str, device: dict[str, Any] | None) -> ValidationRun | None:
    """What a healthy probe's ``device`` block (``/health``) means for validation: a new node or
    a restarted agent (another ``instance``) is validated (``start``); an inventory whose
    fingerprint differs from the last run's is validated again (``change``); a run that could
    not finish is tried again after a backoff (``retry``). A node that says nothing of its
    devices (an external server) gets one run, which fails and says so, while it is
    ``pending``. Returns the run it queued, if any."""
    node = Node.objects.filter(node_id=node_id).first()
    if node is None or node.validation_runs.filter(state__in=OPEN).exists():
        return None
    if device is None:
        if node.validation != Node.Validation.PENDING:
            return None
        run = validation_request(
            node_id=node_id, trigger=Run.Trigger.START, requested_by="control loop"
        )
        _end(run, Run.State.FAILED, rules=[_unsupported()], reason=_unsupported().reason)
        return run
    instance, fingerprint = str(device.get("instance") or ""), str(device.get("fingerprint") or "")
    if node.validation == Node.Validation.PENDING or instance != node.device_instance:
        trigger = Run.Trigger.START
    elif fingerprint and node.device_fingerprint and fingerprint != node.device_fingerprint:
        trigger = Run.Trigger.CHANGE
    elif node.validation == Node.Validation.FAILED and _retry_due(node):
        trigger = Run.Trigger.RETRY
    else:
        return None
    return validation_request(
        node_id=node_id, trigger=trigger, requested_by="control loop", instance=instance
    )


def retry_delay_s(errors_in_a_row: int) -> float:
    """How long after a run that could not finish (``error``) the next is tried: 60 s, then
    doubling with each error in a row, at most an hour."""
    return min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** max(0, errors_in_a_row - 1))


def _retry_due(node: Node) -> bool:
    """True when the node's last runs errored and the backoff since the last has passed (a
    failed verdict is not retried: the machine must change, or an operator asks)."""
    recent = list(
        node.validation_runs.order_by("-created_at").values_list("state", "finished_at")[:8]
    )
    errors = 0
    for state, _ in recent:
        if state != Run.State.ERROR:
            break
        errors += 1
    if not errors or recent[0][1] is None:
        return False
    return _age_s(recent[0][1]) >= retry_delay_s(errors)


@transaction.atomic
def validation_waive(*, node_id: str, reason: str, by: str) -> Node:
    """Let a node take traffic without a passing validation (an external server that cannot
    validate, a known warning): ``waived`` with who and why; a run under way then ends without
    changing it. Raises ``Node.DoesNotExist``, ``ValueError`` for an empty reason."""
    if not reason.strip():
        raise ValueError("a reason is required to waive validation")
    node = Node.objects.select_for_update().get(node_id=node_id)
    node.validation = Node.Validation.WAIVED
    node.validation_reason = f"waived by {by or 'an operator'}: {reason.strip()}"[:2000]
    node.save(update_fields=["validation", "validation_reason", "updated_at"])
    _event(node, node.validation_reason)
    return node


# The step -------------------------------------------------------------------------------


def validation_due() -> list[int]:
    """The open runs, oldest first: the ones to step now."""
    runs = Run.objects.filter(state__in=OPEN).order_by("created_at", "id")
    return list(runs.values_list("pk", flat=True))


def validation_advance(run_id: int) -> None:
    """One step of run ``run_id``, while this process holds it (``console.lib.jobs.hold`` on
    ``lease_until``: two control loops never poll or start one run at once): poll it when
    running; start it when queued and it measures nobody else (``nodes.validation_machines``:
    one run per machine at a time, or several when each node is pinned to CPUs of its own;
    ``validation_start`` reads the running runs afresh). A run that cannot be advanced (an
    error of ours) ends ``error``."""
    with hold(Run, run_id, lease_s=LEASE_S, renew_s=RENEW_S) as held:
        if not held:
            return
        run = Run.objects.filter(pk=run_id, state__in=OPEN).select_related("node").first()
        if run is None:
            return
        try:
            if run.state == Run.State.RUNNING:
                validation_poll(run)
            else:
                validation_start(run)
        except Exception as exc:  # one bad run must not hold up the others
            log.exception("validation %s could not be advanced", run.pk)
            _end(run, Run.State.ERROR, reason=f"the control plane could not advance it: {exc}")


def validation_step_kind() -> StepKind:
    """Device validations as a step kind (``nodes.apps`` registers it with the control loop's
    runner, ``console.lib.steps``): every ``STEP_INTERVAL_S``, one step of each open run."""
    return StepKind(
        "validation", due=validation_due, step=validation_advance, interval_s=STEP_INTERVAL_S
    )


def validation_step() -> list[ValidationRun]:
    """Advance every open run once, oldest first (``validation_advance``), without one run
    holding up the others. Returns the open runs it found."""
    runs = list(
        Run.objects.filter(state__in=OPEN).select_related("node").order_by("created_at", "id")
    )
    for run in runs:
        validation_advance(run.pk)
    return runs


def validation_start(run: ValidationRun) -> bool:
    """Ask the node to start ``run``; True when the node's CPUs are busy with a run now (this
    one, or one another process started meanwhile). An unreachable or busy node is asked again
    next step, until ``TIMEOUT_S`` after the run was queued."""
    node = run.node
    if _host_busy(run):
        return True
    try:
        node_client.validation_start(node.address, node_id=node.node_id, run=run.token)
    except node_client.ValidationUnsupported:
        _end(run, Run.State.FAILED, rules=[_unsupported()], reason=_unsupported().reason)
        return False
    except (node_client.NodeValidationBusy, httpx.HTTPError, ValueError) as exc:
        if _age_s(run.created_at) > TIMEOUT_S:
            _end(
                run,
                Run.State.ERROR,
                reason=f"the node did not start the run in {TIMEOUT_S:g} s: {exc}",
            )
        return False
    Run.objects.filter(pk=run.pk, state=Run.State.QUEUED).update(
        state=Run.State.RUNNING, started_at=timezone.now(), phase="starting"
    )
    return True  # the node runs it, whichever process marked the row


def _host_busy(run: ValidationRun) -> bool:
    """True when a run that ``run`` would disturb is running (read afresh: another process
    may have started one since this one listed the runs)."""
    running = Run.objects.filter(state=Run.State.RUNNING).exclude(pk=run.pk)
    placements = running.values_list("node__address", "node__cpu_set")
    return not may_start(
        _placement(run.node), (Placement.of(address=a, cpu_set=c) for a, c in placements)
    )


def _unsupported() -> RuleResult:
    return RuleResult(
        "protocol",
        FAIL,
        "the node does not report its devices (an external OpenAI-compatible server?): "
        "check it by hand, then waive validation to let it take traffic",
    )


def validation_poll(run: ValidationRun) -> None:
    """Read the node's progress on ``run``; finish it when the node is done. A run still open
    ``TIMEOUT_S`` after it started ends ``error``, whatever the node answers."""
    node = run.node
    try:
        state = node_client.validation_state(node.address, node_id=node.node_id)
    except (httpx.HTTPError, ValueError) as exc:
        state = {"error": f"no answer from the node: {exc}"}
    if not isinstance(state, dict):
        state = {"error": "the node's answer is not a JSON object"}
    if _age_s(run.started_at) > TIMEOUT_S:
        why = state.get("error") or state.get("phase")
        _end(run, Run.State.ERROR, reason=f"not done after {TIMEOUT_S:g} s: {why}")
    elif "run" not in state:
        return  # no answer this time: asked again next step
    elif state.get("run") != run.token:
        _end(run, Run.State.ERROR, reason="the node no longer knows the run: it restarted")
    elif state.get("state") == "failed":
        _end(run, Run.State.ERROR, reason=f"the node could not finish: {state.get('error')}")
    elif state.get("state") == "done":
        validation_finish(run, state.get("report"))
    else:
        phase, progress = str(state.get("phase") or "")[:64], figure(state.get("progress")) or 0.0
        if (phase, progress) != (run.phase, run.progress):
            Run.objects.filter(pk=run.pk, state=Run.State.RUNNING).update(
                phase=phase, progress=min(1.0, progress)
            )


# Verdicts -------------------------------------------------------------------------------


def report_problem(report: Any) -> str:
    """Why a node's report cannot be judged ("" when it can): it must be an object with
    ``inventory``, ``engine`` (whole numbers for ``ENGINE_KEYS``) and ``bench`` (finite
    numbers for ``BENCH_KEYS``) objects."""
    if not isinstance(report, dict):
        return "the report is not a JSON object"
    for part in ("inventory", "engine", "bench"):
        if not isinstance(report.get(part), dict):
            return f"the report's {part} is not a JSON object"
    engine, bench = report["engine"], report["bench"]
    bad = [
        k
        for k in ENGINE_KEYS
        if not isinstance(engine.get(k), int) or isinstance(engine.get(k), bool)
    ]
    bad += [k for k in BENCH_KEYS if figure(bench.get(k)) is None]
    return f"the report lacks numbers for {', '.join(bad)}" if bad else ""


def validation_finish(run: ValidationRun, report: Any) -> ValidationRun:
    """Apply the matrix to a finished run's report, compare its inventory with the node's
    previous run, and set the node's validation (and the pool's measured speeds). A report
    of the wrong shape (``report_problem``, or odd values inside) ends the run ``error``,
    naming what is wrong."""
    problem = report_problem(report)
    if problem:
        _end(run, Run.State.ERROR, reason=f"malformed report from the node: {problem}")
        return run
    node = run.node
    pool = pool_figures(node, package_id=run.package_id)
    facts = Facts(
        inventory=report["inventory"],
        engine=report["engine"],
        bench=report["bench"],
        pool_decode_tok_s_8=pool.get("decode_tok_s_8"),
        pool_note=pool_note(pool),
    )
    previous = (
        node.validation_runs.exclude(pk=run.pk)
        .filter(inventory__isnull=False)
        .order_by("-created_at")
        .first()
    )
    try:
        results = evaluate(facts)
        changes = diff(previous.inventory, facts.inventory) if previous else []
    except (TypeError, ValueError, KeyError, AttributeError) as exc:  # odd shapes inside
        reason = f"malformed report from the node: {type(exc).__name__}: {exc}"
        _end(run, Run.State.ERROR, reason=reason)
        return run
    findings = [f"{r.rule}: {r.reason}" for r in results if r.status != "pass"]
    ended = _end(
        run,
        _VERDICT[overall(results)],
        rules=results,
        reason="; ".join(findings) or "every rule passes",
        report=report,
        pool=pool,
        changes=changes,
    )
    if ended:
        pool_rejudge(package_id=run.package_id, rule=_pool_rule)
        speeds_refresh(package_id=run.package_id)
    return run


def _pool_rule(bench: dict[str, Any], pool: dict[str, Any]) -> list[dict[str, str]]:
    """The pool rule alone, for ``pool_rejudge``."""
    facts = Facts(
        inventory={},
        bench=bench,
        pool_decode_tok_s_8=pool.get("decode_tok_s_8"),
        pool_note=pool_note(pool),
    )
    return [r.as_dict() for r in pool_rules(facts, load_matrix())]


@transaction.atomic
def _end(
    run: ValidationRun,
    state: str,
    *,
    reason: str,
    rules: list[RuleResult] | None = None,
    report: dict[str, Any] | None = None,
    pool: dict[str, Any] | None = None,
    changes: list[dict[str, Any]] | None = None,
) -> bool:
    """End ``run`` as ``state`` (only if it is still open) and, while the node waits for it
    (``validating``: not waived or reset by hand meanwhile), set its validation from it;
    False when someone else ended it first."""
    report = report or {}
    fields = {
        "state": state,
        "reason": reason[:4000],
        "finished_at": timezone.now(),
        "progress": 1.0,
        "phase": "",
        "rules": [r.as_dict() for r in rules or []],
        "changes": changes or [],
        "pool": pool,
        "inventory": report.get("inventory"),
        "engine": report.get("engine"),
        "bench": report.get("bench"),
        "seconds": figure(report.get("seconds")),
        "node_instance": str(report.get("instance") or run.node_instance or "")[:64],
        "fingerprint": str(report.get("fingerprint") or "")[:64],
    }
    if not Run.objects.filter(pk=run.pk, state__in=OPEN).update(**fields):
        return False
    for key, value in fields.items():
        setattr(run, key, value)
    node = Node.objects.select_for_update().get(pk=run.node_id)
    update = ["updated_at"]
    if node.validation == Node.Validation.VALIDATING:
        node.validation, node.validation_reason = _NODE_STATUS[state], reason[:2000]
        update += ["validation", "validation_reason"]
    if run.node_instance:  # an errored run too: this agent process is not asked again at once
        node.device_instance = run.node_instance
        update.append("device_instance")
    if run.fingerprint:
        node.device_fingerprint = run.fingerprint
        update.append("device_fingerprint")
    node.save(update_fields=update)
    changed = f"; changed since the last run: {len(run.changes)}" if run.changes else ""
    _event(node, f"validation {run.pk} {run.get_state_display().lower()}{changed}: {reason}")
    return True


def validation_wait(
    run: ValidationRun, *, timeout_s: float = TIMEOUT_S + 30, on_step=None
) -> ValidationRun:
    """Advance ``run`` (and any other open run) until it ends or ``timeout_s`` pass;
    ``on_step(run)`` after each step. Used by ``manage.py validate``; safe beside the control
    loop. Returns the run as it stands (check ``ended``)."""
    deadline = timezone.now() + timedelta(seconds=timeout_s)
    while True:
        validation_step()
        run.refresh_from_db()
        if on_step is not None:
            on_step(run)
        if run.finished or timezone.now() > deadline:
            return run
        threading.Event().wait(STEP_INTERVAL_S)
