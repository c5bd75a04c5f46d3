"""Admin API for the node inventory (``/api/nodes``): list, register, change, remove, drain,
undrain and the event log; join tokens, joining and revoking a node's credential
(docs/node-protocol.md, "Joining from another host"). Reads need the viewer role, drain/undrain
operator, the rest admin (``console.lib.access``); ``POST /api/nodes/join`` needs a join token
instead, ``GET /api/nodes/self`` the node's own credential. Errors: ``{"detail", "code",
"field"}`` with 401/403/404/409/422."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from django.http import HttpRequest
from django.utils.timezone import now
from ninja import Field, Router, Schema

from console import services
from console.lib.access import NEEDS_ADMIN, NEEDS_OPERATOR, NEEDS_VIEWER
from console.lib.errors import ConsoleError, Invalid, NotFound
from console.lib.log_store import MAX_LINES, records_store
from inference.models import ModelPackage
from nodes import joining
from nodes.models import Node
from nodes.selectors import nodes_with_pinned

router = Router(tags=["nodes"])


class NodeOut(Schema):
    node_id: str
    kind: str = Field(
        "phalanx", description="phalanx (a node agent) or external (any OpenAI-compatible server)"
    )
    served_name: str = Field(
        "", description="the model name clients ask it for ('': its package's)"
    )
    address: str
    state: str
    weight: float
    affinity: bool
    cpu_set: str
    threads: int
    package: str | None = Field(None, description="name:version of the package it serves")
    package_id: int | None
    consecutive_failures: int
    last_probe_at: datetime | None
    last_probe_error: str
    load: float | None
    last_seen_load: dict | None
    sessions: int = Field(0, description="sessions pinned to it")
    validation: str = Field(
        "pending",
        description="device validation: pending, validating, passed, warned, failed, waived",
    )
    validation_reason: str = ""
    measured_speed: float | None = Field(
        None, description="decode tok/s at 8 sequences over the pool's median"
    )
    weight_measured: bool = Field(True, description="routing weight = weight × measured speed")
    routing_weight: float = 1.0
    updated_at: datetime


class NodeIn(Schema):
    node_id: str
    kind: Literal["phalanx", "external"] = "phalanx"
    served_name: str | None = Field(
        None, description="model name clients ask it for (external: required; omitted: kept)"
    )
    address: str = Field(description="host:port of the node's HTTP API")
    package: str | None = Field(None, description="package as name:version (or name: newest)")
    package_id: int | None = None
    weight: float = 1.0
    affinity: bool = True
    cpu_set: str = ""
    threads: int = 1


class NodePatchIn(Schema):
    kind: Literal["phalanx", "external"] | None = None
    served_name: str | None = None
    address: str | None = None
    package: str | None = None
    package_id: int | None = None
    weight: float | None = None
    affinity: bool | None = None
    cpu_set: str | None = None
    threads: int | None = None
    weight_measured: bool | None = None


class NodeEventOut(Schema):
    id: int
    node_id: str
    kind: str
    message: str
    created_at: datetime


def _out(node_id: str) -> NodeOut:
    node = nodes_with_pinned().filter(node_id=node_id).first()
    if node is None:
        raise NotFound(f"No node {node_id!r}.", code="node_not_found")
    return _schema(node)


def _schema(node: Node) -> NodeOut:
    return NodeOut(
        node_id=node.node_id,
        kind=node.kind,
        served_name=node.served_name,
        address=node.address,
        state=node.state,
        weight=node.weight,
        affinity=node.affinity,
        cpu_set=node.cpu_set,
        threads=node.threads,
        package=node.package.key if node.package else None,
        package_id=node.package_id,
        consecutive_failures=node.consecutive_failures,
        last_probe_at=node.last_probe_at,
        last_probe_error=node.last_probe_error,
        load=node.load,
        last_seen_load=node.last_seen_load,
        sessions=getattr(node, "pinned", 0),
        validation=node.validation,
        validation_reason=node.validation_reason,
        measured_speed=node.measured_speed,
        weight_measured=node.weight_measured,
        routing_weight=node.routing_weight,
        updated_at=node.updated_at,
    )


def _package_id(key: str | None, package_id: int | None) -> int | None:
    if key is None:
        return package_id
    name, _, version = key.partition(":")
    packages = ModelPackage.objects.filter(name=name)
    if version:
        packages = packages.filter(version=version)
    package = packages.order_by("-created_at", "-id").first()
    if package is None:
        raise Invalid(f"package: no package {key!r}.", field="package")
    return package.pk


# --- joining from another host (before /nodes/{node_id}, which would take these paths) ------


class JoinTokenIn(Schema):
    ttl_s: int = Field(joining.DEFAULT_TTL_S, description="seconds it is valid (60 to 604800)")
    note: str = Field("", description="what it is for (the host it goes to)")


class JoinTokenOut(Schema):
    prefix: str
    note: str
    created_by: str
    created_at: datetime
    expires_at: datetime
    used_at: datetime | None
    node_id: str = Field("", description="the node it made")
    state: str = Field(description="unused, used or expired")


class JoinTokenMintedOut(JoinTokenOut):
    token: str = Field(description="the token itself: shown in this answer only")
    command: str = Field(description="what to run on the node's host")


class JoinIn(Schema):
    join_token: str
    node_id: str
    address: str = Field(description="host:port the control plane reaches the node at")
    package: str | None = Field(None, description="package as name:version (or name: newest)")


class JoinOut(Schema):
    node_id: str
    credential: str = Field(description="what the control plane presents to the node")
    proof_key: str = Field(description="what the node answers the control plane's challenge with")
    epoch: str
    array_id: str


class NodeSelfOut(Schema):
    node_id: str
    address: str
    state: str


def _token_out(row, **extra) -> dict:
    state = "used" if row.used_at else "expired" if row.expires_at <= now() else "unused"
    fields = ("prefix", "note", "created_by", "created_at", "expires_at", "used_at")
    return {
        **{f: getattr(row, f) for f in fields},
        "node_id": row.joined_node_id,
        "state": state,
        **extra,
    }


@router.post(
    "/nodes/join-tokens",
    response={201: JoinTokenMintedOut},
    summary="Mint a one-time join token",
    auth=NEEDS_ADMIN,
)
def nodes_join_token_mint(request: HttpRequest, payload: JoinTokenIn) -> tuple[int, dict]:
    row, raw = services.join_token_mint(ttl_s=payload.ttl_s, note=payload.note)
    base = request.build_absolute_uri("/").rstrip("/")
    return 201, _token_out(row, token=raw, command=joining.join_command(base, raw))


@router.get(
    "/nodes/join-tokens",
    response=list[JoinTokenOut],
    summary="Recent join tokens",
    auth=NEEDS_ADMIN,
)
def nodes_join_tokens(request: HttpRequest) -> list[dict]:
    return [_token_out(row) for row in joining.join_tokens_recent()]


@router.post(
    "/nodes/join",
    response={201: JoinOut},
    summary="Join the array with a join token (a node agent's call)",
    auth=None,
)
def nodes_join(request: HttpRequest, payload: JoinIn) -> tuple[int, JoinOut]:
    joining.join_token_check(raw=payload.join_token)  # first: a wrong token learns nothing
    package_id = _package_id(payload.package, None) if payload.package else None
    grant = services.node_join(
        join_token=payload.join_token,
        node_id=payload.node_id,
        address=payload.address,
        package_id=package_id,
    )
    return 201, JoinOut(**grant.__dict__)


class NodeCredentialRefused(ConsoleError):
    status = 401
    code = "node_credential_refused"


@router.get(
    "/nodes/self",
    response=NodeSelfOut,
    summary="The calling node's registration (node credential)",
    auth=None,
)
def nodes_self(request: HttpRequest, node_id: str) -> NodeSelfOut:
    node = joining.node_presents_own_credential(
        node_id=node_id, authorization=request.headers.get("Authorization")
    )
    if node is None:
        raise NodeCredentialRefused(
            f"not the credential of node {node_id!r} (revoked, or never this array's)."
        )
    return NodeSelfOut(node_id=node.node_id, address=node.address, state=node.state)


class LogsStoredOut(Schema):
    stored: int = Field(description="records kept")
    rejected: int = Field(description="lines that were not records (dropped)")
    problem: str = Field(description="what was wrong with the first rejected line")


@router.post(
    "/nodes/self/logs",
    response={200: LogsStoredOut},
    summary="Ship the calling node's log records (JSON lines; node credential)",
    auth=None,
)
def nodes_self_logs(request: HttpRequest, node_id: str) -> LogsStoredOut:
    """The body: one JSON record a line (``console.lib.logs``' json form), at most the body
    limit; each record is stamped with ``node_id``. 422 when no line is a record."""
    node = joining.node_presents_own_credential(
        node_id=node_id, authorization=request.headers.get("Authorization")
    )
    if node is None:
        raise NodeCredentialRefused(
            f"not the credential of node {node_id!r} (revoked, or never this array's)."
        )
    lines = request.body.splitlines()
    if len(lines) > MAX_LINES:
        raise Invalid(f"at most {MAX_LINES} records a request, got {len(lines)}", field="body")
    stored = records_store(lines, node_id=node.node_id)
    if stored.rejected and not stored.stored:
        raise Invalid(f"no log record in the body: {stored.problem}", field="body")
    return LogsStoredOut(**stored.__dict__)


@router.post(
    "/nodes/{node_id}/revoke",
    response=NodeOut,
    summary="Revoke a node's credential (it is refused at once)",
    auth=NEEDS_ADMIN,
)
def nodes_revoke(request: HttpRequest, node_id: str) -> NodeOut:
    services.node_revoke_credential(node_id=node_id)
    return _out(node_id)


@router.get("/nodes", response=list[NodeOut], summary="List nodes", auth=NEEDS_VIEWER)
def nodes_list(request: HttpRequest) -> list[NodeOut]:
    rows = nodes_with_pinned()
    return [_schema(n) for n in rows]


@router.post("/nodes", response={201: NodeOut}, summary="Register a node", auth=NEEDS_ADMIN)
def nodes_create(request: HttpRequest, payload: NodeIn) -> tuple[int, NodeOut]:
    data = payload.dict()
    data["package_id"] = _package_id(data.pop("package"), data["package_id"])
    services.node_create(**data)
    return 201, _out(payload.node_id)


@router.get("/nodes/{node_id}", response=NodeOut, summary="Show a node", auth=NEEDS_VIEWER)
def nodes_show(request: HttpRequest, node_id: str) -> NodeOut:
    return _out(node_id)


@router.put(
    "/nodes/{node_id}",
    response={200: NodeOut, 201: NodeOut},
    summary="Register or replace a node (idempotent)",
    auth=NEEDS_ADMIN,
)
def nodes_put(request: HttpRequest, node_id: str, payload: NodeIn) -> tuple[int, NodeOut]:
    if payload.node_id != node_id:
        raise Invalid("node_id: must match the URL.", field="node_id")
    data = payload.dict()
    data["package_id"] = _package_id(data.pop("package"), data["package_id"])
    if data["served_name"] is None:  # not given: what the node serves under is kept
        data.pop("served_name")
    if Node.objects.filter(node_id=node_id).exists():
        data.pop("node_id")
        services.node_update(node_id=node_id, changes=data)
        return 200, _out(node_id)
    services.node_create(**data)
    return 201, _out(node_id)


@router.patch(
    "/nodes/{node_id}", response=NodeOut, summary="Change some of a node's fields", auth=NEEDS_ADMIN
)
def nodes_patch(request: HttpRequest, node_id: str, payload: NodePatchIn) -> NodeOut:
    changes = payload.dict(exclude_unset=True)
    if "package" in changes:
        changes["package_id"] = _package_id(changes.pop("package"), None)
    services.node_update(node_id=node_id, changes=changes)
    return _out(node_id)


@router.delete("/nodes/{node_id}", response={204: None}, summary="Remove a node", auth=NEEDS_ADMIN)
def nodes_delete(request: HttpRequest, node_id: str) -> tuple[int, None]:
    services.node_remove(node_id=node_id)
    return 204, None


@router.post(
    "/nodes/{node_id}/drain", response=NodeOut, summary="Drain a node", auth=NEEDS_OPERATOR
)
def nodes_drain(request: HttpRequest, node_id: str) -> NodeOut:
    services.node_set_drained(node_id=node_id, drained=True)
    return _out(node_id)


@router.post(
    "/nodes/{node_id}/undrain", response=NodeOut, summary="Undrain a node", auth=NEEDS_OPERATOR
)
def nodes_undrain(request: HttpRequest, node_id: str) -> NodeOut:
    services.node_set_drained(node_id=node_id, drained=False)
    return _out(node_id)


@router.get(
    "/nodes/{node_id}/events",
    response=list[NodeEventOut],
    summary="A node's events",
    auth=NEEDS_VIEWER,
)
def nodes_events(request: HttpRequest, node_id: str, limit: int = 50) -> list[NodeEventOut]:
    node = Node.objects.filter(node_id=node_id).first()
    if node is None:
        raise NotFound(f"No node {node_id!r}.", code="node_not_found")
    if not 1 <= limit <= 1000:
        raise Invalid("limit: between 1 and 1000.", field="limit")
    return [
        NodeEventOut(
            id=e.pk, node_id=node_id, kind=e.kind, message=e.message, created_at=e.created_at
        )
        for e in node.events.all()[:limit]
    ]
