"""Packages, API tokens and the session routing table: everything that writes them.

Functions are synchronous (ORM); async edges call them through ``sync_to_async``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from inference.errors import ArrayFull, AuthError, NoHealthyNode, UnknownModel
from inference.models import ApiToken, ModelPackage, RouteDecision, RoutingPolicy, SessionRoute
from inference.routing import Decision, Limits, NoNodeAvailable, Saturated, route_request
from nodes.models import Node
from nodes.selectors import nodes_for_routing

ENV_TOKEN = "PHALANX_API_TOKEN"
TOKEN_PREFIX = "phx_"


class PackageConflict(Exception):
    """``name:version`` exists with another file; packages are immutable."""


# --- packages -------------------------------------------------------------------------------


def package_register(
    *,
    name: str,
    version: str,
    gguf_path: str,
    sha256: str,
    quantization: str = "",
    architecture: str = "",
    context_window: int = 2048,
    chat_template: str = "",
) -> tuple[ModelPackage, bool]:
    """Register a package version (idempotent); returns ``(package, created)``.

    Raises ``PackageConflict`` when ``name:version`` exists with another sha256.
    """
    existing = ModelPackage.objects.filter(name=name, version=version).first()
    if existing is not None:
        if existing.sha256 != sha256:
            raise PackageConflict(f"{existing.key} exists with sha256 {existing.sha256[:12]}…")
        return existing, False
    package = ModelPackage.objects.create(
        name=name,
        version=version,
        gguf_path=gguf_path,
        sha256=sha256,
        quantization=quantization,
        architecture=architecture,
        context_window=context_window,
        chat_template=chat_template,
    )
    return package, True


def package_resolve(*, model: str) -> ModelPackage:
    """The package a client's ``model`` names: ``name`` (newest version) or ``name:version``.

    Raises ``UnknownModel`` naming the model.
    """
    name, _, version = model.strip().partition(":")
    packages = ModelPackage.objects.filter(name=name)
    if version:
        packages = packages.filter(version=version)
    package = packages.order_by("-created_at", "-id").first()
    if package is None:
        raise UnknownModel(
            f"The model {model!r} does not exist; GET /v1/models lists the "
            f"models this array serves.",
            param="model",
        )
    return package


# --- API tokens -----------------------------------------------------------------------------


def _hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def token_create(*, name: str, created_by_id: int | None = None) -> tuple[ApiToken, str]:
    """Mint an API token; returns ``(token, plaintext)``. Only the hash is stored: show it once."""
    plaintext = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        name=name, token_hash=_hash(plaintext), prefix=plaintext[:10], created_by_id=created_by_id
    )
    return token, plaintext


def token_revoke(*, token_id: int) -> None:
    """Revoke a token; it stops working on the next request."""
    ApiToken.objects.filter(pk=token_id).update(revoked=True)


def token_authenticate(*, raw: str | None) -> str:
    """Check a Bearer token; returns a name for the caller (the token's name, or ``env`` for
    ``$PHALANX_API_TOKEN``). Raises ``AuthError`` when missing, unknown or revoked."""
    if not raw:
        raise AuthError(
            "Missing API token: send 'Authorization: Bearer <token>'.", code="missing_api_key"
        )
    env_token = os.environ.get(ENV_TOKEN)
    if env_token and hmac.compare_digest(raw.encode(), env_token.encode()):
        return "env"
    token = ApiToken.objects.filter(token_hash=_hash(raw)).first()
    if token is None or token.revoked:
        raise AuthError("Invalid API token." if token is None else "This API token was revoked.")
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > timedelta(minutes=1):
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.name


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, or None."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


# --- routing table --------------------------------------------------------------------------

DECISION_LOG_LENGTH = 50  # decisions kept per session, newest last


@dataclass(frozen=True)
class RouteTarget:
    """Where to send one attempt of a request: node id and address, the package name the node
    serves (sent as ``model``), and the routing decision. ``kv_source`` is the address of the
    node a moving session leaves when that node is still reachable (draining, or up and
    overloaded), so the proxy can carry the session's KV over instead of prefilling again."""

    node_id: str
    address: str
    model: str
    decision: Decision
    kv_source: str | None = None


def routing_limits(policy: RoutingPolicy) -> Limits:
    """The policy's routing knobs as plain data for ``inference.routing``."""
    return Limits(
        strategy=policy.failover_strategy,
        overload_threshold=policy.overload_threshold,
        rebalance_target=policy.rebalance_target,
        max_inflight_per_node=policy.max_inflight_per_node,
    )


def _log(route: SessionRoute, *, action: str, node_id: str, reason: str) -> None:
    RouteDecision.objects.create(route=route, action=action, node_id=node_id, reason=reason)
    stale = route.decisions.order_by("-created_at", "-id").values_list("pk", flat=True)[
        DECISION_LOG_LENGTH:
    ]
    if stale:
        RouteDecision.objects.filter(pk__in=list(stale)).delete()


def route_resolve(
    *,
    session_id: str | None,
    model: str,
    exclude: Mapping[str, str] | None = None,
    new_turn: bool = True,
    inflight: Mapping[str, int] | None = None,
    policy: RoutingPolicy | None = None,
) -> RouteTarget:
    """Pick the node for a request for package ``model`` and record pins and moves.

    Without ``session_id`` the request is routed by load and nothing is stored. With one, the
    session's route is created or updated in one transaction: a pin idle for longer than
    ``policy.session_idle_release_s`` is released first; placed, moved and released decisions
    are appended to its log (the last ``DECISION_LOG_LENGTH`` kept), ``moves`` counts
    redirects, ``turns`` counts requests (only when ``new_turn``; retries of the same request
    pass False). ``exclude`` maps node ids that failed this request to a reason; ``inflight``
    is this process's ``{node_id: open requests}``.

    Raises ``NoHealthyNode`` (503) or ``ArrayFull`` (429), both with ``retry_after`` (s).
    """
    policy = policy or RoutingPolicy.load()
    limits = routing_limits(policy)
    stale_after_s = max(3 * policy.health_interval_s, 10.0)
    retry_after = max(1, round(policy.health_interval_s))
    if session_id is None:
        nodes, addresses = nodes_for_routing(stale_after_s=stale_after_s, inflight=inflight)
        decision = _decide(nodes, model=model, exclude=exclude, limits=limits, session=False)
        return RouteTarget(decision.node_id, addresses[decision.node_id], model, decision)
    now = timezone.now()
    with transaction.atomic():
        route, created = (
            SessionRoute.objects.select_for_update()
            .select_related("node")
            .get_or_create(session_id=session_id)
        )
        if not created:
            _release_if_idle(route, now=now, idle_after_s=policy.session_idle_release_s)
        if route.node_id is None:
            _serialize_placements()
        nodes, addresses = nodes_for_routing(stale_after_s=stale_after_s, inflight=inflight)
        cooling = route.moved_for_load_at is not None and now - route.moved_for_load_at < (
            timedelta(seconds=policy.move_cooldown_s)
        )
        decision = _decide(
            nodes,
            model=model,
            exclude=exclude,
            limits=limits,
            pinned=route.node.node_id if route.node_id else None,
            may_move_for_load=not cooling,
            retry_after=retry_after,
        )
        kv_source = None
        if decision.pins:
            kv_source = _record_pin(
                route, decision, now=now, nodes=nodes, addresses=addresses, exclude=exclude or {}
            )
        if new_turn:
            route.turns += 1
        route.save()
    return RouteTarget(
        decision.node_id, addresses[decision.node_id], model, decision, kv_source=kv_source
    )


def _release_if_idle(route: SessionRoute, *, now: datetime, idle_after_s: float) -> None:
    """Drop the pin of a session idle for longer than ``idle_after_s`` (logged)."""
    if route.node_id is None or now - route.last_seen_at <= timedelta(seconds=idle_after_s):
        return
    idle = (now - route.last_seen_at).total_seconds()
    node_id = route.node.node_id
    _log(
        route,
        action=RouteDecision.Action.RELEASED,
        node_id=node_id,
        reason=f"released from {node_id}: idle {idle:.0f} s",
    )
    route.node = None


def _serialize_placements() -> None:
    """Placements must see each other: requests run in parallel threads (and replicas), and
    sessions that arrive together would otherwise all read the same pinned counts and land on
    one node. Row locks on the nodes serialize them on PostgreSQL; SQLite's BEGIN IMMEDIATE
    (settings) already serializes every write transaction."""
    list(Node.objects.select_for_update().values_list("pk", flat=True))


def _record_pin(
    route: SessionRoute,
    decision: Decision,
    *,
    now: datetime,
    nodes: list[Any],
    addresses: dict[str, str],
    exclude: Mapping[str, str],
) -> str | None:
    """Point ``route`` at a placed or moved decision's node and log it; returns the address
    to take the session's KV from (a move off a node still reachable), else None."""
    route.node = Node.objects.get(node_id=decision.node_id)
    if route.package_id is None or decision.action == "placed":
        route.package_id = route.node.package_id
    kv_source = None
    if decision.action == "moved":
        route.moves += 1
        kv_source = _kv_source(nodes, addresses, decision, exclude)
    if decision.for_load:
        route.moved_for_load_at = now
    _log(route, action=decision.action, node_id=decision.node_id, reason=decision.reason)
    return kv_source


def _decide(
    nodes: list[Any],
    *,
    model: str,
    exclude: Mapping[str, str] | None,
    limits: Limits,
    session: bool = True,
    pinned: str | None = None,
    may_move_for_load: bool = True,
    retry_after: int = 1,
) -> Decision:
    try:
        return route_request(
            nodes,
            model=model,
            pinned=pinned,
            session=session,
            exclude=exclude,
            limits=limits,
            may_move_for_load=may_move_for_load,
        )
    except NoNodeAvailable as exc:
        raise NoHealthyNode(str(exc), retry_after=retry_after) from exc
    except Saturated as exc:
        raise ArrayFull(f"The array is full: {exc}.", retry_after=1) from exc


def _kv_source(
    nodes: list[Any], addresses: dict[str, str], decision: Decision, exclude: Mapping[str, str]
) -> str | None:
    previous = next((n for n in nodes if n.node_id == decision.previous), None)
    if previous is None or previous.node_id in exclude or previous.state not in ("up", "draining"):
        return None
    return addresses[previous.node_id]


def route_record_kv_move(*, session_id: str, node_id: str, reason: str) -> None:
    """Append a ``kv_moved`` entry ("KV moved from node-02: 812 tokens") to the session's log."""
    route = SessionRoute.objects.filter(session_id=session_id).first()
    if route is not None:
        _log(route, action=RouteDecision.Action.KV_MOVED, node_id=node_id, reason=reason)


@transaction.atomic
def route_release(*, session_id: str, reason: str = "released by operator") -> str | None:
    """Unpin a session (its next turn is placed afresh) and log why; returns the address of
    the node it was pinned to (so its KV can be erased there), or None when it was not pinned.
    Raises ``SessionRoute.DoesNotExist`` for an unknown session."""
    route = (
        SessionRoute.objects.select_for_update().select_related("node").get(session_id=session_id)
    )
    if route.node is None:
        return None
    address = route.node.address
    _log(
        route,
        action=RouteDecision.Action.RELEASED,
        node_id=route.node.node_id,
        reason=f"{reason} (was on {route.node.node_id})",
    )
    route.node = None
    route.save(update_fields=["node", "last_seen_at"])
    return address


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
    for name, value in changes.items():
        setattr(policy, name, value)
    policy.full_clean()
    policy.save()
    return policy


def transcript_get(*, session_id: str) -> list[dict[str, Any]]:
    """The stored transcript of a session (empty for a new one)."""
    route = SessionRoute.objects.filter(session_id=session_id).only("transcript").first()
    return list(route.transcript) if route else []


@transaction.atomic
def transcript_append(*, session_id: str, messages: list[dict[str, Any]]) -> int:
    """Append OpenAI messages to a session's transcript (creating the route if needed);
    returns the transcript's new length in messages."""
    route, _ = SessionRoute.objects.select_for_update().get_or_create(session_id=session_id)
    route.transcript = [*route.transcript, *messages]
    route.save(update_fields=["transcript", "last_seen_at"])
    return len(route.transcript)


def session_package_name(*, session_id: str) -> str | None:
    """Name of the package a session started on, or None for a new session."""
    route = SessionRoute.objects.filter(session_id=session_id).select_related("package").first()
    return route.package.name if route and route.package else None
