"""Admin API for the routing table and the routing policy (django-ninja ``Router``).

- ``GET /api/sessions?node=&limit=&offset=``: the routing table, most recent first.
- ``GET /api/sessions/{session_id}``: one session with its routing decision log, so an operator
  can answer "why is this session here".
- ``POST /api/sessions/{session_id}/release``: unpin it (its next turn is placed afresh) and
  erase its KV on the node it leaves.
- ``GET /api/routing/policy``, ``PUT /api/routing/policy``: read and change the policy; ``PUT``
  takes any subset of the fields and applies on the next request and tick (no restart).

Authentication and roles are each operation's ``auth`` (``console.lib.access.NEEDS_*``): a Bearer
token or a logged-in user, with the role checked before the body is.
"""

from __future__ import annotations

from datetime import datetime

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema

from console.lib.access import NEEDS_OPERATOR, NEEDS_VIEWER
from inference import selectors, services
from inference.models import RoutingPolicy, SessionRoute

router = Router(tags=["routing"])


def _not_found(session_id: str) -> Exception:
    from console.lib.errors import NotFound

    return NotFound(f"No session {session_id!r} in the routing table.", code="unknown_session")


class DecisionOut(Schema):
    action: str = Field(description="placed | moved | released | kv_moved")
    node_id: str
    reason: str = Field(description='e.g. "moved to node-01: node-02 down"')
    created_at: datetime


class SessionOut(Schema):
    session_id: str
    node: str | None = Field(description="node id it is pinned to; null when not pinned")
    package: str | None = Field(description="name:version it started on")
    turns: int
    moves: int
    messages: int = Field(description="messages in the stored (websocket) transcript")
    created_at: datetime
    last_seen_at: datetime


class SessionDetailOut(SessionOut):
    decisions: list[DecisionOut] = Field(description="routing decision log, oldest first")


class SessionListOut(Schema):
    count: int
    items: list[SessionOut]


class ReleaseOut(Schema):
    session_id: str
    released: bool = Field(description="False when it was not pinned")
    kv_erased: bool = Field(description="True when the node it left held KV for it")


class SessionFilter(Schema):
    node: str | None = Field(None, description="only sessions pinned to this node id")
    limit: int = Field(100, ge=1, le=1000)
    offset: int = Field(0, ge=0)


def _session_out(route: SessionRoute) -> dict:
    return {
        "session_id": route.session_id,
        "node": route.node.node_id if route.node else None,
        "package": route.package.key if route.package else None,
        "turns": route.turns,
        "moves": route.moves,
        "messages": len(route.transcript or []),
        "created_at": route.created_at,
        "last_seen_at": route.last_seen_at,
    }


@router.get("/sessions", response={200: SessionListOut}, auth=NEEDS_VIEWER)
def sessions_list(request: HttpRequest, filters: Query[SessionFilter]) -> dict:
    """The routing table, most recently seen first."""
    count, routes = selectors.session_routes(
        node_id=filters.node, limit=filters.limit, offset=filters.offset
    )
    return {"count": count, "items": [_session_out(r) for r in routes]}


@router.post("/sessions/{path:session_id}/release", response={200: ReleaseOut}, auth=NEEDS_OPERATOR)
def session_release(request: HttpRequest, session_id: str) -> dict:
    """Unpin a session and erase its KV on the node it leaves (best effort)."""
    try:
        released, erased = services.route_release_erasing(session_id=session_id)
    except SessionRoute.DoesNotExist:
        raise _not_found(session_id) from None
    return {"session_id": session_id, "released": released, "kv_erased": erased}


@router.get("/sessions/{path:session_id}", response={200: SessionDetailOut}, auth=NEEDS_VIEWER)
def session_show(request: HttpRequest, session_id: str) -> dict:
    """One session: where it is pinned and its decision log."""
    route = selectors.session_route(session_id=session_id)
    if route is None:
        raise _not_found(session_id)
    return {
        **_session_out(route),
        "decisions": [
            {
                "action": d.action,
                "node_id": d.node_id,
                "reason": d.reason,
                "created_at": d.created_at,
            }
            for d in route.decisions.all()
        ],
    }


class PolicyOut(Schema):
    session_header: str
    model_aliases: dict[str, str]
    default_model: str
    failover_strategy: str = Field(
        description="stick_and_redirect | stick_and_rebalance | least_loaded"
    )
    health_interval_s: float
    failure_threshold: int
    recovery_threshold: int
    probe_timeout_s: float
    connect_timeout_s: float
    request_timeout_s: float
    first_byte_floor_s: float
    first_byte_margin: float
    max_attempts: int
    retry_backoff_ms: int
    session_idle_release_s: float
    overload_threshold: float
    rebalance_target: float
    move_cooldown_s: float
    canary_idle_s: float
    canary_timeout_s: float
    max_inflight_per_node: int
    max_inflight: int
    queue_wait_s: float
    updated_at: datetime


class PolicyIn(Schema):
    """Any subset of the policy's fields; unknown fields are refused."""

    model_config = {"extra": "forbid"}

    session_header: str | None = None
    model_aliases: dict[str, str] | None = None
    default_model: str | None = None
    failover_strategy: str | None = None
    health_interval_s: float | None = None
    failure_threshold: int | None = None
    recovery_threshold: int | None = None
    probe_timeout_s: float | None = None
    connect_timeout_s: float | None = None
    request_timeout_s: float | None = None
    first_byte_floor_s: float | None = None
    first_byte_margin: float | None = None
    max_attempts: int | None = None
    retry_backoff_ms: int | None = None
    session_idle_release_s: float | None = None
    overload_threshold: float | None = None
    rebalance_target: float | None = None
    move_cooldown_s: float | None = None
    canary_idle_s: float | None = None
    canary_timeout_s: float | None = None
    max_inflight_per_node: int | None = None
    max_inflight: int | None = None
    queue_wait_s: float | None = None


@router.get("/routing/policy", response={200: PolicyOut}, auth=NEEDS_VIEWER)
def policy_show(request: HttpRequest) -> RoutingPolicy:
    """The routing policy."""
    return RoutingPolicy.load()


@router.put("/routing/policy", response={200: PolicyOut}, auth=NEEDS_OPERATOR)
def policy_change(request: HttpRequest, payload: PolicyIn) -> RoutingPolicy:
    """Change some policy fields; bad values answer 422 naming the field."""
    return services.policy_update(changes=payload.dict(exclude_unset=True))
