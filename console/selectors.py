"""Reads for the console pages and the admin API: the array at a glance, a node, packages with
what their GGUF file says, the routing table and a session's decision log."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from django.db.models import Count, Q

from console.models import ArrayConfig, AuditEntry
from inference.gguf_meta import read_gguf_info
from inference.models import ApiToken, ModelPackage, RouteDecision, RoutingPolicy, SessionRoute
from nodes.models import Node, NodeEvent


@dataclass(frozen=True)
class GgufFacts:
    """What a GGUF file says of itself: architecture, parameter count (sum of tensor sizes),
    quantization type, context length (tokens), chat template, tensor count, file size (bytes).
    ``error`` is set (and the rest empty) when the file is missing or unreadable here."""

    exists: bool
    size_bytes: int | None = None
    architecture: str = ""
    parameters: int | None = None
    quantization: str = ""
    context_length: int | None = None
    chat_template: str = ""
    tensors: int | None = None
    name: str = ""
    error: str = ""

    @property
    def parameters_human(self) -> str:
        """``135M``, ``1.7B`` ..."""
        if not self.parameters:
            return "—"
        for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
            if self.parameters >= size:
                return f"{self.parameters / size:.3g}{unit}"
        return str(self.parameters)


@lru_cache(maxsize=64)
def _facts(path: str, mtime: float, size: int) -> GgufFacts:
    info = read_gguf_info(path)  # type: ignore[arg-type]
    try:
        import gguf

        reader = gguf.GGUFReader(path, "r")
        parameters = int(sum(int(t.n_elements) for t in reader.tensors))
        tensors = len(reader.tensors)
        field = reader.fields.get("general.name")
        name = bytes(field.parts[field.data[0]]).decode("utf-8", "replace") if field else ""
    except Exception as exc:  # a damaged file still shows what could be read
        return GgufFacts(exists=True, size_bytes=size, error=f"cannot read tensors: {exc}"[:200])
    return GgufFacts(
        exists=True,
        size_bytes=size,
        architecture=info.architecture,
        parameters=parameters,
        quantization=info.quantization,
        context_length=info.context_window,
        chat_template=info.chat_template,
        tensors=tensors,
        name=name,
    )


def gguf_facts(path: str) -> GgufFacts:
    """Facts of the GGUF file at ``path`` on this host (cached per path, mtime and size)."""
    try:
        stat = os.stat(path)
    except OSError as exc:
        return GgufFacts(exists=False, error=f"not on this host: {exc.strerror}")
    return _facts(path, stat.st_mtime, stat.st_size)


def packages_with_use() -> list[ModelPackage]:
    """Every package with ``node_count``, ``up_count`` and ``sequence_limit`` (the fewest
    tokens a sequence holds on its up nodes, prompt plus output; None until a node reported
    it) annotated, by name then newest."""
    packages = list(
        ModelPackage.objects.annotate(
            node_count=Count("nodes", distinct=True),
            up_count=Count("nodes", filter=Q(nodes__state=Node.State.UP), distinct=True),
        ).order_by("name", "-created_at")
    )
    limits = sequence_limits()
    for package in packages:
        package.sequence_limit = limits.get(package.pk)  # type: ignore[attr-defined]
    return packages


def sequence_limits() -> dict[int, int]:
    """``{package id: tokens per sequence}``, the smallest over the up nodes serving it, from
    their last metrics (KV capacity over sequences)."""
    limits: dict[int, int] = {}
    rows = Node.objects.filter(state=Node.State.UP, package__isnull=False)
    for package_id, load in rows.values_list("package_id", "last_seen_load"):
        capacity = (load or {}).get("kv_capacity")
        total = (load or {}).get("total")
        if capacity and total:
            limit = int(capacity // total)
            limits[package_id] = min(limit, limits.get(package_id, limit))
    return limits


def nodes_with_sessions() -> list[Node]:
    """Every node with its package and ``pinned`` (sessions pinned) annotated."""
    return list(Node.objects.select_related("package").annotate(pinned=Count("session_routes")))


def overview() -> dict[str, Any]:
    """The array at a glance: nodes, counts by state, sessions, recent events, tokens/s sum
    and errors (nodes with failures), from the database (live numbers come over the socket)."""
    nodes = nodes_with_sessions()
    by_state = {s.value: 0 for s in Node.State}
    for node in nodes:
        by_state[node.state] = by_state.get(node.state, 0) + 1
    return {
        "nodes": nodes,
        "by_state": by_state,
        "sessions": SessionRoute.objects.count(),
        "moves": sum(SessionRoute.objects.values_list("moves", flat=True)),
        "failing": [n for n in nodes if n.consecutive_failures or n.last_probe_error],
        "events": list(NodeEvent.objects.select_related("node")[:15]),
        "packages": ModelPackage.objects.count(),
    }


def node_detail(node_id: str) -> dict[str, Any] | None:
    """A node, its recent events, pinned sessions and devices, or None when unknown.

    Devices: the node's CPU set (threads) and the accelerator modules of the config file.
    ``host_ram``: ``{"used_mib", "budget_mib"}`` of idle sessions' KV in the node's host RAM,
    from its last scrape (None before one)."""
    node = Node.objects.select_related("package").filter(node_id=node_id).first()
    if node is None:
        return None
    config = ArrayConfig.load()
    devices = [
        {
            "kind": "CPU",
            "name": f"CPUs {node.cpu_set or 'any'}",
            "detail": f"{node.threads} thread(s)",
        }
    ]
    devices += [
        {"kind": "Accelerator module", "name": m.strip(), "detail": "from config"}
        for m in config.ai_modules.split(",")
        if m.strip()
    ]
    seen = node.last_seen_load or {}
    host_ram = None
    if seen.get("host_ram_budget"):
        host_ram = {
            "used_mib": round((seen.get("host_ram") or 0) / 2**20, 1),
            "budget_mib": round(seen["host_ram_budget"] / 2**20),
        }
    return {
        "node": node,
        "host_ram": host_ram,
        "events": list(node.events.all()[:50]),
        "sessions": list(node.session_routes.select_related("package")[:50]),
        "devices": devices,
    }


def routing_table(limit: int = 200) -> list[SessionRoute]:
    """The newest ``limit`` session routes with node and package."""
    return list(SessionRoute.objects.select_related("node", "package")[:limit])


def session_detail(session_id: str) -> dict[str, Any] | None:
    """A session's route and decision log, or None when unknown."""
    route = (
        SessionRoute.objects.select_related("node", "package").filter(session_id=session_id).first()
    )
    if route is None:
        return None
    decisions = list(RouteDecision.objects.filter(route=route))
    return {"route": route, "decisions": decisions}


def tokens() -> list[ApiToken]:
    """Every API token with its role row and creator."""
    return list(ApiToken.objects.select_related("console_role", "created_by"))


def policy() -> RoutingPolicy:
    return RoutingPolicy.load()


def audit_entries(*, limit: int = 200, action: str | None = None) -> list[AuditEntry]:
    """The newest audit entries (at most ``limit``), optionally of one ``action`` prefix
    (``"node."``)."""
    entries = AuditEntry.objects.all()
    if action:
        entries = entries.filter(action__startswith=action)
    return list(entries[:limit])
