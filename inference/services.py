"""The session routing table and the routing policy: everything that writes them. (Session
transcripts: ``inference.transcripts``; API tokens: ``inference.tokens``; packages:
``inference.packages``.)

Functions are synchronous (ORM); async edges call them through ``sync_to_async``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from console.lib.audit import audit_record, diff
from console.lib.compiled_sql import CompiledQuery, as_datetime
from inference.errors import ArrayFull, NoHealthyNode
from inference.model_names import package_named as package_named
from inference.model_names import package_resolve as package_resolve
from inference.models import RouteDecision, RoutingPolicy, SessionRoute
from inference.node_table import NodeTable, nodes_for_routing
from inference.routing import (
    Decision,
    Limits,
    NoNodeAvailable,
    Rollout,
    Saturated,
    SessionPin,
    route_request,
    route_session,
    version_for_new_session,
)
from nodes import client as node_client
from nodes.models import Node

# --- routing table --------------------------------------------------------------------------

DECISION_LOG_LENGTH = 50  # decisions kept per session, newest last


@dataclass(frozen=True)
class RouteTarget:
    """Where to send one attempt of a request: node id and address, the name the node agent
    answers to (sent as ``model``), the routing decision and ``package``, the ``name:version``
    it serves. ``kv_source`` is the address of the
    node a moving session leaves when that node is still reachable (draining, or up and
    overloaded), so the proxy can carry the session's KV over instead of prefilling again.
    ``record`` is what ``route_record`` must write (None for a request without a session)."""

    node_id: str
    address: str
    model: str
    decision: Decision
    kv_source: str | None = None
    record: RouteWrite | None = None
    prefill_speed: float | None = None  # the node's, tokens/s (first-byte deadline)
    package: str | None = None  # name:version the node serves (reported with the answer)


@dataclass(frozen=True)
class RouteRow:
    """A session's row of the routing table as routing reads it (``node_id`` None: unpinned)."""

    node_id: str | None
    last_seen_at: datetime
    moved_for_load_at: datetime | None = None
    package_id: int | None = None  # the version the session is on


@dataclass(frozen=True)
class RouteWrite:
    """One request's change to a session's route: its decision, the pin it left (``previous``:
    released or moved off), ``released`` (log sentence of an idle release), the package a
    placement starts the session on, whether it counts as a turn, and when it was decided."""

    session_id: str
    decision: Decision
    previous: str | None
    released: str | None
    package_id: int | None
    new_turn: bool
    at: datetime
    version_changed: bool = False  # served by another version than its last turn


def routing_limits(policy: RoutingPolicy) -> Limits:
    """The policy's routing knobs as plain data for ``inference.routing``."""
    return Limits(
        strategy=policy.failover_strategy,
        overload_threshold=policy.overload_threshold,
        rebalance_target=policy.rebalance_target,
        max_inflight_per_node=policy.max_inflight_per_node,
    )


def routing_stale_after_s(policy: RoutingPolicy) -> float:
    """Age (s) past which a node's last scraped load counts as unknown."""
    return max(3 * policy.health_interval_s, 10.0)


def _log(route: SessionRoute, *, action: str, node_id: str, reason: str) -> None:
    RouteDecision.objects.create(route=route, action=action, node_id=node_id, reason=reason)
    stale = route.decisions.order_by("-created_at", "-id").values_list("pk", flat=True)[
        DECISION_LOG_LENGTH:
    ]
    if stale:
        RouteDecision.objects.filter(pk__in=list(stale)).delete()


_route_rows = CompiledQuery(
    lambda session_id: SessionRoute.objects.filter(session_id=session_id).values_list(
        "node__node_id", "last_seen_at", "moved_for_load_at", "package_id"
    )
)


def route_read(*, session_id: str) -> RouteRow | None:
    """The session's routing-table row, or None for a session never seen (one indexed read)."""
    rows = _route_rows.rows(session_id)
    if not rows:
        return None
    node_id, last_seen_at, moved_for_load_at, package_id = rows[0]
    return RouteRow(node_id, as_datetime(last_seen_at), as_datetime(moved_for_load_at), package_id)


def route_plan(
    *,
    session_id: str | None,
    row: RouteRow | None,
    table: NodeTable,
    model: str,
    policy: RoutingPolicy,
    exclude: Mapping[str, str] | None = None,
    new_turn: bool = True,
    now: datetime | None = None,
    rollout: Rollout | None = None,
    prefix: str | None = None,
) -> RouteTarget:
    """Decide where a request for ``model`` (a client-facing name: ``model_names``) goes,
    without touching the database.

    A session stays on the package version it is on (``row.package_id``) while a node of
    that version can take it; a new one, while an upgrade of ``model`` runs (``rollout``),
    starts on the version its share gives it (``routing.version_for_new_session``).

    ``row`` is the session's route (``route_read``, None for a new session), ``table`` the
    inventory (``nodes_for_routing``); ``exclude`` maps node ids that failed this request to a
    reason; ``prefix`` the request's agent (``inference.agent_prefix``), which a placement
    prefers a node holding. Without ``session_id`` the request is routed by load and nothing is to be recorded;
    with one, ``RouteTarget.record`` is the change for ``route_record``. A pin idle for longer
    than ``policy.session_idle_release_s`` is released first; ``new_turn`` False marks a retry
    of the same request (``turns`` is not counted again).

    Raises ``NoHealthyNode`` (503) or ``ArrayFull`` (429), both with ``retry_after`` (s).
    """
    limits = routing_limits(policy)
    retry_after = max(1, round(policy.health_interval_s))
    if session_id is None:
        decision = _decide(
            table.views,
            model=model,
            exclude=exclude,
            limits=limits,
            retry_after=retry_after,
            prefix=prefix,
        )
        return _target(table, decision, model)
    now = now or timezone.now()
    pin = _session_pin(row, now=now, cooldown_s=policy.move_cooldown_s)
    plan = _decide(
        table.views,
        model=model,
        exclude=exclude,
        limits=limits,
        retry_after=retry_after,
        pin=pin,
        idle_release_s=policy.session_idle_release_s,
        version=_session_version(session_id, row, rollout),
        prefix=prefix,
    )
    decision = plan.decision
    record = _route_write(session_id, row, plan, pin, table, new_turn=new_turn, at=now)
    kv_source = _kv_source(table, decision, exclude or {}) if decision.action == "moved" else None
    return _target(table, decision, model, kv_source=kv_source, record=record)


def _session_version(session_id: str, row: RouteRow | None, rollout: Rollout | None) -> int | None:
    """The package version (id) a session's turn must run on: the one it is on, else while
    ``rollout`` runs the one its share gives it, else None (any)."""
    if row is not None and row.package_id is not None:
        return row.package_id
    return version_for_new_session(session_id, rollout) if rollout is not None else None


def _route_write(
    session_id: str,
    row: RouteRow | None,
    plan: Any,
    pin: SessionPin,
    table: NodeTable,
    *,
    new_turn: bool,
    at: datetime,
) -> RouteWrite:
    """The routing-table change for ``plan`` (``_decide``'s answer) of a session whose route
    was ``row``: the previous node when it moved or was released, the version it now runs."""
    decision = plan.decision
    package_id = table.package_ids.get(decision.node_id)
    return RouteWrite(
        session_id=session_id,
        decision=decision,
        previous=pin.node_id if (decision.pins or plan.released) else None,
        released=plan.released,
        package_id=package_id,
        new_turn=new_turn,
        at=at,
        version_changed=row is not None
        and row.package_id is not None
        and package_id != row.package_id,
    )


def _target(table: NodeTable, decision: Any, model: str, **extra: Any) -> RouteTarget:
    """The ``RouteTarget`` of ``decision``: the node's address, the name it serves (else
    ``model``), its prefill speed and the package version on it; ``extra``: ``kv_source``,
    ``record``."""
    return RouteTarget(
        decision.node_id,
        table.addresses[decision.node_id],
        table.node_names.get(decision.node_id) or model,
        decision,
        prefill_speed=table.prefill_speed(decision.node_id),
        package=table.package_keys.get(decision.node_id),
        **extra,
    )


def _session_pin(row: RouteRow | None, *, now: datetime, cooldown_s: float) -> SessionPin:
    if row is None:
        return SessionPin()
    cooling = row.moved_for_load_at is not None and (
        now - row.moved_for_load_at < timedelta(seconds=cooldown_s)
    )
    idle = max(0.0, (now - row.last_seen_at).total_seconds())
    return SessionPin(row.node_id, idle_s=idle, cooling=cooling)


def route_record(write: RouteWrite) -> None:
    """Write one request's change (``route_plan``'s ``record``) to the session's route: the idle
    release and the placement or move go to its decision log (the last ``DECISION_LOG_LENGTH``
    kept), ``moves`` counts redirects, ``turns`` counts requests, ``last_seen_at`` is bumped.
    Creates the route for a new session. Raises ``Node.DoesNotExist`` when the node is gone.

    The two common cases take one statement each: a turn that stays on its node (an UPDATE)
    and the placement of a session never seen (two INSERTs); the rest locks the row."""
    decision = write.decision
    if decision.action == "stuck" and not write.released and not write.version_changed:
        turns = F("turns") + 1 if write.new_turn else F("turns")
        if SessionRoute.objects.filter(session_id=write.session_id).update(
            turns=turns, last_seen_at=timezone.now()
        ):
            return
    if decision.action == "placed" and write.previous is None and _route_create(write):
        return
    _route_update(write)


def _route_create(write: RouteWrite) -> bool:
    """Insert the route of a session placed for the first time; False when it exists."""
    try:
        with transaction.atomic():
            route = SessionRoute.objects.create(
                session_id=write.session_id,
                node=Node.objects.get(node_id=write.decision.node_id),
                package_id=write.package_id,
                turns=1 if write.new_turn else 0,
            )
            RouteDecision.objects.create(
                route=route,
                action=write.decision.action,
                node_id=write.decision.node_id,
                reason=write.decision.reason,
            )
    except IntegrityError:
        return False
    return True


@transaction.atomic
def _route_update(write: RouteWrite) -> None:
    route, _ = SessionRoute.objects.select_for_update().get_or_create(session_id=write.session_id)
    decision = write.decision
    if write.released:
        _log(
            route,
            action=RouteDecision.Action.RELEASED,
            node_id=write.previous or "",
            reason=write.released,
        )
        route.node = None
    if write.version_changed:
        route.version_changes += 1
        route.package_id = write.package_id
        _log(
            route,
            action=RouteDecision.Action.VERSION_CHANGED,
            node_id=decision.node_id,
            reason="no node of the session's package version can take it; "
            f"{decision.node_id} serves another",
        )
    if decision.pins:
        route.node = Node.objects.get(node_id=decision.node_id)
        if route.package_id is None or decision.action == "placed":
            route.package_id = write.package_id
        if decision.action == "moved":
            route.moves += 1
        if decision.for_load:
            route.moved_for_load_at = write.at
        _log(route, action=decision.action, node_id=decision.node_id, reason=decision.reason)
    if write.new_turn:
        route.turns += 1
    route.save()


def route_resolve(
    *,
    session_id: str | None,
    model: str,
    exclude: Mapping[str, str] | None = None,
    new_turn: bool = True,
    inflight: Mapping[str, int] | None = None,
    policy: RoutingPolicy | None = None,
) -> RouteTarget:
    """Read, decide and record in one synchronous call (``route_read``, ``nodes_for_routing``,
    ``route_plan``, ``route_record``): routing for callers without the proxy's write-behind
    (``inference.route_writer``). ``inflight`` is a process's ``{node_id: open requests}``.
    Raises what ``route_plan`` raises."""
    policy = policy or RoutingPolicy.load()
    row = route_read(session_id=session_id) if session_id else None
    table = nodes_for_routing(stale_after_s=routing_stale_after_s(policy), inflight=inflight)
    target = route_plan(
        session_id=session_id,
        row=row,
        table=table,
        model=model,
        policy=policy,
        exclude=exclude,
        new_turn=new_turn,
        rollout=_rollout_for(model) if session_id else None,
    )
    if target.record is not None:
        route_record(target.record)
    return target


def _rollout_for(model: str) -> Rollout | None:
    from inference.lookups import rollout_for

    return rollout_for(model)


def _decide(
    nodes: list[Any],
    *,
    model: str,
    exclude: Mapping[str, str] | None,
    limits: Limits,
    retry_after: int,
    pin: SessionPin | None = None,
    idle_release_s: float = 0.0,
    version: int | None = None,
    prefix: str | None = None,
) -> Any:
    """``route_session`` for a session (``pin`` given, returns a ``SessionPlan``), else
    ``route_request`` without a session (a ``Decision``); routing's refusals become the
    proxy's 503 / 429."""
    try:
        if pin is None:
            return route_request(
                nodes, model=model, session=False, exclude=exclude, limits=limits, prefix=prefix
            )
        return route_session(
            nodes,
            model=model,
            pin=pin,
            idle_release_s=idle_release_s,
            exclude=exclude,
            limits=limits,
            version=version,
            prefix=prefix,
        )
    except NoNodeAvailable as exc:
        raise NoHealthyNode(str(exc), retry_after=retry_after) from exc
    except Saturated as exc:
        raise ArrayFull(f"The array is full: {exc}.", retry_after=1) from exc


def _kv_source(table: NodeTable, decision: Decision, exclude: Mapping[str, str]) -> str | None:
    """Address to carry a moving session's KV from: the node it leaves, while reachable (never
    to or from an external server: it has no session KV to export or import)."""
    if decision.node_id in table.external or decision.previous in table.external:
        return None
    previous = next((n for n in table.views if n.node_id == decision.previous), None)
    if previous is None or previous.node_id in exclude or previous.state not in ("up", "draining"):
        return None
    return table.addresses[previous.node_id]


def route_record_kv_move(*, session_id: str, node_id: str, reason: str) -> None:
    """Append a ``kv_moved`` entry ("KV moved from node-02: 812 tokens") to the session's log."""
    route = SessionRoute.objects.filter(session_id=session_id).first()
    if route is not None:
        _log(route, action=RouteDecision.Action.KV_MOVED, node_id=node_id, reason=reason)


@transaction.atomic
def route_release(*, session_id: str, reason: str = "released by operator") -> Node | None:
    """Unpin a session (its next turn is placed afresh) and log why; returns the node it was
    pinned to (so its KV can be erased there), or None when it was not pinned.
    Raises ``SessionRoute.DoesNotExist`` for an unknown session."""
    route = (
        SessionRoute.objects.select_for_update().select_related("node").get(session_id=session_id)
    )
    node = route.node
    if node is None:
        return None
    _log(
        route,
        action=RouteDecision.Action.RELEASED,
        node_id=route.node.node_id,
        reason=f"{reason} (was on {route.node.node_id})",
    )
    route.node = None
    route.save(update_fields=["node", "last_seen_at"])
    return node


def route_release_erasing(*, session_id: str) -> tuple[bool, bool]:
    """``route_release`` by the operator, then erase the session's KV on the node it left
    (best effort); returns ``(released, kv_erased)``. Raises ``SessionRoute.DoesNotExist``."""
    node = route_release(session_id=session_id)
    audit_record(
        action="session.release",
        target=session_id,
        changes=[f"node: {node.node_id if node else '(none)'} \u2192 (none)"],
    )
    if node is None:
        return False, False
    erased = node_client.session_erase_sync(
        node.address, node_id=node.node_id, session_id=session_id, timeout=2.0
    )
    return True, erased


def routes_release_idle(*, idle_s: float) -> int:
    """Release every pin idle for more than ``idle_s`` seconds; returns how many (control loop).

    Keeps the pinned-session counts that placement uses true between a session's turns."""
    cutoff = timezone.now() - timedelta(seconds=idle_s)
    released = 0
    for session_id in SessionRoute.objects.filter(
        node__isnull=False, last_seen_at__lt=cutoff
    ).values_list("session_id", flat=True)[:1000]:
        if route_release(session_id=session_id, reason=f"released: idle over {idle_s:.0f} s"):
            released += 1
    return released


def policy_update(*, changes: Mapping[str, Any]) -> RoutingPolicy:
    """Apply ``{field: value}`` to the routing policy after validating every field.

    Raises ``django.core.exceptions.ValidationError`` (``message_dict`` names the fields) or
    ``ValueError`` for a field that does not exist. Takes effect on the next request and tick.
    """
    policy = RoutingPolicy.load()
    editable = {f.name for f in RoutingPolicy._meta.concrete_fields} - {"id", "updated_at"}
    unknown = sorted(set(changes) - editable)
    if unknown:
        raise ValueError(f"unknown policy field(s): {', '.join(unknown)}")
    before = {name: getattr(policy, name) for name in changes}
    for name, value in changes.items():
        setattr(policy, name, value)
    policy.full_clean()
    policy.save()
    changed = diff(before, {name: getattr(policy, name) for name in changes})
    if changed:
        audit_record(action="policy.update", target="routing policy", changes=changed)
    return policy
