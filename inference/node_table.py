"""The node table as routing reads it: every node as a ``NodeView`` (``nodes_for_routing``)
and the sessions pinned to each (``pinned_counts``), read with the SQL compiled once
(``console.lib.compiled_sql``: these run on the proxy's hot path). The rule of which nodes
take traffic is the nodes app's (``nodes.selectors.routing_state``); the decisions are
``inference.routing``'s pure functions."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from django.db.models import Count
from django.utils import timezone

from console.lib.compiled_sql import CompiledQuery, as_datetime, as_json
from inference.model_names import client_name, package_key
from inference.models import SessionRoute
from inference.routing import NodeView
from nodes.credentials import remember_epochs
from nodes.models import Node, effective_weight
from nodes.selectors import routing_state


def _number(data: Any, key: str) -> float | None:
    if isinstance(data, dict) and isinstance(data.get(key), int | float):
        return float(data[key])
    return None


@dataclass(frozen=True)
class PinnedCounts:
    """Sessions pinned to each node (``{node_id: count}``), as read at ``read_at``
    (``time.monotonic()`` just before the read)."""

    counts: dict[str, int]
    read_at: float


_pinned_rows = CompiledQuery(
    lambda: (
        SessionRoute.objects.filter(node__isnull=False)
        .values_list("node__node_id")
        .annotate(n=Count("id"))
    )
)


def pinned_counts() -> PinnedCounts:
    """How many sessions are pinned to each node (nodes without any are left out)."""
    read_at = time.monotonic()
    return PinnedCounts(dict(_pinned_rows.rows()), read_at)


@dataclass(frozen=True)
class NodeTable:
    """The inventory as routing sees it: ``views`` (one ``NodeView`` per node), each node's
    address and package id, and ``pinned_read_at``: when the pinned-session counts in the views
    were read (``time.monotonic()``)."""

    views: list[NodeView]
    addresses: dict[str, str] = field(default_factory=dict)
    package_ids: dict[str, int | None] = field(default_factory=dict)
    pinned_read_at: float = 0.0
    node_names: dict[str, str | None] = field(default_factory=dict)  # what each node answers to
    package_keys: dict[str, str | None] = field(default_factory=dict)  # name:version it serves
    external: frozenset[str] = frozenset()  # external OpenAI-compatible servers: no session KV

    def prefill_speed(self, node_id: str) -> float | None:
        """The node's measured prefill speed (tokens/s), None when unknown."""
        view = next((v for v in self.views if v.node_id == node_id), None)
        return view.prefill_speed if view else None

    def with_local_counts(
        self, *, pinned_delta: Mapping[str, int], inflight: Mapping[str, int]
    ) -> NodeTable:
        """A copy with this process's counts as of now: pinned-session counts plus
        ``pinned_delta`` (``{node_id: +/- sessions}`` this process pinned that the counts did
        not show yet at ``pinned_read_at``), and ``inflight`` (``{node_id: open requests}``)."""
        views = [
            replace(
                v,
                sessions=max(0, v.sessions + pinned_delta.get(v.node_id, 0)),
                inflight=inflight.get(v.node_id, 0),
            )
            for v in self.views
        ]
        return replace(self, views=views)


_NODE_FIELDS = (
    "node_id",
    "kind",
    "state",
    "weight",
    "affinity",
    "address",
    "package_id",
    "package__name",
    "package__version",
    "package__family",
    "served_name",
    "last_probe_at",
    "last_seen_load",
    "max_sessions",
    "kv_budget_tokens",
    "validation",
    "measured_speed",
    "weight_measured",
    "credential_epoch",
)


_node_rows = CompiledQuery(lambda: Node.objects.values_list(*_NODE_FIELDS))


def _view(
    node: dict[str, Any], seen: Any, *, sessions: int, inflight: Mapping[str, int]
) -> NodeView:
    """One node's row (``_NODE_FIELDS``) as routing sees it, with its load as last ``seen``
    (None: unknown or stale)."""
    return NodeView(
        node_id=node["node_id"],
        state=routing_state(node["state"], node["validation"]),
        weight=effective_weight(
            node["weight"], node["measured_speed"], bool(node["weight_measured"])
        ),
        load=_number(seen, "load"),
        model=client_name(
            served_name=node["served_name"],
            package_name=node["package__name"],
            family=node["package__family"],
        ),
        sessions=sessions,
        affinity=bool(node["affinity"]),
        total=_number(seen, "total"),
        kv_used=_number(seen, "kv_used"),
        kv_capacity=_number(seen, "kv_capacity"),
        max_sessions=node["max_sessions"],
        kv_budget=node["kv_budget_tokens"],
        inflight=inflight.get(node["node_id"], 0),
        prefill_speed=_number(seen, "prefill_speed"),
        package_id=node["package_id"],
        prefixes=frozenset((seen or {}).get("prefixes") or ()),
    )


def nodes_for_routing(
    *,
    stale_after_s: float,
    inflight: Mapping[str, int] | None = None,
    pinned: PinnedCounts | None = None,
) -> NodeTable:
    """Every node as a routing ``NodeView``, with addresses and package ids (``NodeTable``).
    A view's ``model`` is the name clients ask for (``inference.model_names.client_name``: the
    family); ``node_names`` what the node agent itself answers to, ``package_keys`` the
    ``name:version`` it serves.

    A load older than ``stale_after_s`` seconds (no recent probe) counts as unknown, so a
    silent node is never taken for idle. ``sessions`` counts the routes pinned to each node
    (``pinned``, read now when not given: the proxy passes counts it reads less often);
    ``inflight`` (``{node_id: open requests}``, this process's own count) is copied in.
    """
    pinned = pinned or pinned_counts()
    cutoff = timezone.now() - timedelta(seconds=stale_after_s)
    views: list[NodeView] = []
    addresses: dict[str, str] = {}
    package_ids: dict[str, int | None] = {}
    node_names: dict[str, str | None] = {}
    package_keys: dict[str, str | None] = {}
    open_requests = inflight or {}
    external: set[str] = set()
    rows = _node_rows.rows()
    remember_epochs((r[0], r[-1], r[1]) for r in rows)  # node_id, credential_epoch, kind
    for row in rows:
        node = dict(zip(_NODE_FIELDS, row, strict=True))
        node_id = node["node_id"]
        probed = as_datetime(node["last_probe_at"])
        seen = as_json(node["last_seen_load"]) if probed is not None and probed >= cutoff else None
        views.append(
            _view(node, seen, sessions=pinned.counts.get(node_id, 0), inflight=open_requests)
        )
        addresses[node_id] = node["address"]
        if node["kind"] == "external":
            external.add(node_id)
        package_ids[node_id] = node["package_id"]
        node_names[node_id] = node["served_name"] or node["package__name"]
        package_keys[node_id] = package_key(node["package__name"], node["package__version"])
    return NodeTable(
        views,
        addresses,
        package_ids,
        pinned.read_at,
        node_names,
        package_keys,
        frozenset(external),
    )
