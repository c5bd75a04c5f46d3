"""Changes to the node inventory: probe results, failures seen by the proxy, drain, register,
and what an upgrade changes on a node (the package it serves, its weight)."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from console.lib.audit import acting_as, audit_record, diff
from nodes.client import ProbeResult
from nodes.live import live_node_changed
from nodes.models import Node, NodeEvent

CONTROL_LOOP, PROXY, UP = "control loop", "proxy", "up"


def _set_state(node: Node, state: str, kind: str, message: str, *, actor: str) -> NodeEvent:
    """Change a node's state, log the event (by ``actor``), and tell open console pages once
    it commits."""
    node.state = state
    event = NodeEvent.objects.create(node=node, kind=kind, message=message, actor=actor[:150])
    live_node_changed(node_id=node.node_id, event=event)
    return event


@transaction.atomic
def node_record_probe(
    *,
    node_id: str,
    result: ProbeResult,
    failure_threshold: int,
    recovery_threshold: int = 1,
    canary_ran: bool = False,
) -> NodeEvent | None:
    """Apply one health probe to the node's state; returns the event it caused, if any.

    A healthy answer resets ``consecutive_failures``, stores the load summary, marks an
    ``unknown`` node ``up`` and a ``down`` node ``up`` only after ``recovery_threshold``
    consecutive healthy probes (a ``came_back`` event): a flapping node stays down instead of
    drawing sessions back and forth. ``last_active_at`` moves when the node's request counter
    grew by more than our own canary (``canary_ran``: a canary completion was sent this tick,
    ``last_canary_at`` is set). A failed probe bumps the counter and clears the load; at
    ``failure_threshold`` consecutive failures the node goes ``down`` (``went_down`` event). A
    draining node stays draining either way: drain is the operator's intent. Raises
    ``Node.DoesNotExist`` for an unknown id.
    """
    node = Node.objects.select_for_update().get(node_id=node_id)
    now = timezone.now()
    node.last_probe_at = now
    if canary_ran:
        node.last_canary_at = now
    event = None
    if result.ok:
        node.consecutive_failures = 0
        node.consecutive_successes += 1
        node.last_probe_error = ""
        _note_activity(node, result.load, now=now, canary_ran=canary_ran)
        node.last_seen_load = result.load
        if node.state == Node.State.DOWN and node.consecutive_successes >= recovery_threshold:
            event = _set_state(
                node,
                Node.State.UP,
                NodeEvent.Kind.CAME_BACK,
                f"answers /health again ({node.consecutive_successes} good probes"
                + (", the last with a canary completion)" if canary_ran else ")"),
                actor=CONTROL_LOOP,
            )
        elif node.state == Node.State.UNKNOWN:
            node.state = Node.State.UP
    else:
        node.consecutive_failures += 1
        node.consecutive_successes = 0
        node.last_probe_error = result.error[:255]
        node.last_seen_load = None
        event = _maybe_down(
            node,
            failure_threshold,
            f"{node.consecutive_failures} failed probes, last: {result.error}",
            actor=CONTROL_LOOP,
        )
    node.save()
    return event


def _note_activity(node: Node, load: dict | None, *, now, canary_ran: bool) -> None:
    before = (node.last_seen_load or {}).get("requests") if node.last_seen_load else None
    after = (load or {}).get("requests")
    if after is None:
        return
    if before is None or after > before:
        node.last_active_at = now
    if canary_ran and load is not None:
        load["requests"] = after + 1  # our own canary is not activity


def _maybe_down(node: Node, threshold: int, message: str, *, actor: str) -> NodeEvent | None:
    if node.consecutive_failures >= threshold and node.state in (Node.State.UP, Node.State.UNKNOWN):
        return _set_state(
            node, Node.State.DOWN, NodeEvent.Kind.WENT_DOWN, message[:1000], actor=actor
        )
    return None


@transaction.atomic
def node_record_failure(*, node_id: str, reason: str, failure_threshold: int) -> NodeEvent | None:
    """Count a request that failed on the node (refused, timed out, broke mid-stream) as a failed
    probe, so a dead node is marked down without waiting for the control loop. Unknown ids are
    ignored (the node may have been removed meanwhile)."""
    node = Node.objects.select_for_update().filter(node_id=node_id).first()
    if node is None:
        return None
    node.consecutive_failures += 1
    node.consecutive_successes = 0
    node.last_probe_error = f"proxy: {reason}"[:255]
    node.last_seen_load = None
    event = _maybe_down(node, failure_threshold, f"request failed: {reason}", actor=PROXY)
    node.save()
    return event


def node_record_restart(*, node_id: str, message: str, actor: str = UP) -> NodeEvent | None:
    """Log that the embedded array restarts a node agent (``up``: one that exited, or one an
    operator asked to restart, then ``actor`` is that operator), and tell open console pages.
    Unknown ids are ignored."""
    node = Node.objects.filter(node_id=node_id).first()
    if node is None:
        return None
    event = NodeEvent.objects.create(
        node=node, kind=NodeEvent.Kind.RESTARTED, message=message, actor=actor[:150]
    )
    live_node_changed(node_id=node_id, event=event)
    return event


@transaction.atomic
def node_drain(*, node_id: str, by: str = "operator") -> NodeEvent | None:
    """Stop new sessions to the node; its pinned sessions move at their next turn. ``by``
    names who drains it in the event and the audit entry ("alice", "upgrade 3")."""
    node = Node.objects.select_for_update().get(node_id=node_id)
    if node.state == Node.State.DRAINING:
        return None
    before = node.state
    event = _set_state(
        node, Node.State.DRAINING, NodeEvent.Kind.DRAINED, f"drained by {by}", actor=by
    )
    node.save()
    _audit_state(node, "node.drain", before, by=by)
    return event


@transaction.atomic
def node_undrain(*, node_id: str, by: str = "operator") -> NodeEvent | None:
    """Let a drained node take traffic again once the control loop sees it healthy. ``by``
    names who undrains it in the event and the audit entry."""
    node = Node.objects.select_for_update().get(node_id=node_id)
    if node.state != Node.State.DRAINING:
        return None
    before = node.state
    event = _set_state(
        node, Node.State.UNKNOWN, NodeEvent.Kind.UNDRAINED, f"undrained by {by}", actor=by
    )
    node.consecutive_failures = 0
    node.save()
    _audit_state(node, "node.undrain", before, by=by)
    return event


def _audit_state(node: Node, action: str, before: str, *, by: str) -> None:
    with acting_as(by):
        audit_record(
            action=action,
            target=node.node_id,
            changes=diff({"state": before}, {"state": node.state}),
        )


class NotRestartable(ValueError):
    """The node's agent was not started by an embedded array that could restart it."""


@transaction.atomic
def node_request_restart(*, node_id: str, by: str) -> NodeEvent | None:
    """Ask the embedded array that started the node's agent (``Node.supervisor``, set by
    ``up``) to restart it: drain it now (no new session; pinned ones move at their next turn),
    and ``up`` restarts the agent once no stream is in flight (``console.embedded.restarts_due``),
    then undrains it if this drained it. Returns the drain event, or None when the node was
    draining already or a restart is already asked for. Raises ``NotRestartable`` (an external
    or remote node: this array cannot signal a process it did not start) and
    ``Node.DoesNotExist``."""
    node = Node.objects.select_for_update().get(node_id=node_id)
    if not node.supervisor:
        raise NotRestartable(
            f"{node_id} was not started by this array's `up`: restart it where it runs"
        )
    if node.restart_requested_at is not None:
        return None
    node.restart_requested_at, node.restart_requested_by = timezone.now(), by[:150]
    node.restart_undrain = node.state != Node.State.DRAINING
    event = None
    if node.restart_undrain:
        message = f"drained by {by} to restart it (once no stream is in flight)"
        event = _set_state(node, Node.State.DRAINING, NodeEvent.Kind.DRAINED, message, actor=by)
    node.save()
    return event


def node_upsert(
    *,
    node_id: str,
    address: str,
    package_id: int | None,
    cpu_set: str = "",
    threads: int = 1,
    weight: float = 1.0,
    affinity: bool = True,
    weight_measured: bool | None = None,
    kind: str | None = None,
    served_name: str | None = None,
    by: str = "",
) -> tuple[Node, bool]:
    """Create or update a node by id (idempotent); returns ``(node, created)``.

    Changing a node's address or package resets its state to ``unknown`` until the next probe
    and its device validation to ``pending`` (unless waived): the control loop validates it
    again before it takes traffic. An external node (``kind``) is registered with its
    validation waived, saying why (``EXTERNAL_WAIVER``). ``served_name`` (None: keep) is the
    name clients ask it for. ``by``: who registers it (the ``registered`` event's actor).
    """
    fields = {
        "address": address,
        "package_id": package_id,
        "cpu_set": cpu_set,
        "threads": threads,
        "weight": weight,
        "affinity": affinity,
    }
    node = Node.objects.filter(node_id=node_id).first()
    if node is None:
        node = Node.objects.create(
            node_id=node_id,
            kind=kind or Node.Kind.PHALANX,
            served_name=served_name or "",
            weight_measured=True if weight_measured is None else weight_measured,
            **fields,
        )
        _waive_if_external(node)
        NodeEvent.objects.create(
            node=node, kind=NodeEvent.Kind.REGISTERED, message=f"at {address}", actor=by
        )
        return node, True
    _reset_if_moved(node, address=address, package_id=package_id)
    if kind is not None and kind != node.kind:
        node.kind = kind
        if not _waive_if_external(node):
            node.validation, node.validation_reason = Node.Validation.PENDING, "now a Phalanx node"
    for name, value in fields.items():
        setattr(node, name, value)
    if weight_measured is not None:  # None: keep (a config file or `up` does not say)
        node.weight_measured = weight_measured
    if served_name is not None:
        node.served_name = served_name
    node.save()
    return node, False


def _reset_if_moved(node: Node, *, address: str, package_id: int | None) -> None:
    """A node given another address or package is unknown until probed, and validated again
    (unless waived); what an upgrade recorded of its package no longer holds."""
    if node.package_id != package_id:  # set by hand: what an upgrade recorded no longer holds
        node.served_name, node.engine_settings = "", {}
    if node.address != address or node.package_id != package_id:
        node.state = Node.State.UNKNOWN if node.state != Node.State.DRAINING else node.state
        node.consecutive_failures = 0
        node.last_seen_load = None
        if node.validation != Node.Validation.WAIVED:  # another machine or model: prove it again
            node.validation, node.device_instance = "pending", ""
            node.validation_reason = "address or package changed: to be validated"


EXTERNAL_WAIVER = (
    "an external OpenAI-compatible server: its devices are not Phalanx's to validate "
    "(waived when it was registered)"
)


def _waive_if_external(node: Node) -> bool:
    """Waive device validation for an external node (saved and audited as
    ``node.waive_validation``, as an operator's waiver is), saying why; True when it did."""
    if node.kind != Node.Kind.EXTERNAL:
        return False
    before = node.validation
    node.validation, node.validation_reason = Node.Validation.WAIVED, EXTERNAL_WAIVER
    node.save(update_fields=["validation", "validation_reason"])
    audit_record(
        action="node.waive_validation",
        target=node.node_id,
        changes=[*diff({"validation": before}, {"validation": node.validation}), EXTERNAL_WAIVER],
    )
    return True


@transaction.atomic
def node_record_package_switch(
    *,
    node_id: str,
    package_id: int,
    served_name: str,
    settings: dict[str, int] | None,
    by: str,
) -> NodeEvent:
    """Record that the node serves package ``package_id`` now, as ``served_name`` (the name
    clients ask for), with the engine ``settings`` it took (``threads`` is its own field; the
    others merge into ``engine_settings``, kept for its restarts). Logs a ``switched`` event by
    ``by`` ("upgrade 3"), audits the change as ``by`` (``node.switch``) and tells open console
    pages. Raises ``Node.DoesNotExist`` for an unknown id."""
    node = Node.objects.select_for_update().select_related("package").get(node_id=node_id)
    before = _switch_fields(node)
    node.package_id, node.served_name = package_id, served_name
    settings = dict(settings or {})
    if "threads" in settings:
        node.threads = settings.pop("threads")
    if settings:
        node.engine_settings = {**(node.engine_settings or {}), **settings}
    node.save(update_fields=["package", "served_name", "threads", "engine_settings"])
    key = node.package.key if node.package_id else None
    event = NodeEvent.objects.create(
        node=node,
        kind=NodeEvent.Kind.SWITCHED,
        message=f"switched by {by}: serves {key} as {served_name}",
        actor=by[:150],
    )
    with acting_as(by):
        audit_record(
            action="node.switch", target=node_id, changes=diff(before, _switch_fields(node))
        )
    live_node_changed(node_id=node_id, event=event)
    return event


def _switch_fields(node: Node) -> dict[str, object]:
    package = node.package.key if node.package_id and node.package else None
    return {
        "package": package,
        "served_name": node.served_name,
        "threads": node.threads,
        "engine_settings": node.engine_settings or {},
    }


@transaction.atomic
def node_set_weight(*, node_id: str, weight: float, by: str) -> None:
    """Set the node's routing weight (0: standby, spare capacity that takes no traffic), as
    ``by`` ("upgrade 3": a surge node takes traffic on the new version, then is spare again);
    audited as ``by`` (``node.update``) and told to open console pages when it changed. Unknown
    ids are ignored (the node may have been removed meanwhile)."""
    node = Node.objects.select_for_update().filter(node_id=node_id).first()
    if node is None or node.weight == weight:
        return
    before, node.weight = node.weight, weight
    node.save(update_fields=["weight"])
    with acting_as(by):
        audit_record(
            action="node.update",
            target=node_id,
            changes=diff({"weight": before}, {"weight": weight}),
        )
    live_node_changed(node_id=node_id)
