"""Routing as pure functions over plain data: which node serves this request, and why.

Nothing here touches the database or the network; ``inference.services`` builds the
``NodeView`` list from the inventory and records the ``Decision``.

Rules (docs/routing.md, ARCHITECTURE.md "Routing"):

- candidates are nodes that are ``up`` (not down, draining or unknown), serve the requested
  model and are not excluded for this request (a node that just failed it);
- a new session, or a request without a session key, goes to the candidate with the lowest
  ``load / weight``; a node whose load is unknown (``None``) is never taken for idle and is only
  chosen when no candidate has a known load; ties go to the node with fewer pinned sessions per
  weight, then to the lower node id (deterministic);
- an existing session sticks to its node while that node is a candidate, otherwise it moves
  (stick_and_redirect) and the reason names what happened to the old node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum


class Action(StrEnum):
    PLACED = "placed"  # a new session pinned to a node
    STUCK = "stuck"  # an existing session stays on its node
    MOVED = "moved"  # an existing session redirected to another node
    BALANCED = "balanced"  # a request without a session key, not pinned


@dataclass(frozen=True)
class NodeView:
    """What routing needs to know about a node.

    ``load`` is the node's load figure (0 idle, 1 every sequence busy, above 1 queueing) or
    ``None`` when unknown; ``sessions`` is the number of sessions pinned to it.
    """

    node_id: str
    state: str  # "up" | "down" | "draining" | "unknown"
    weight: float
    load: float | None
    model: str | None  # name of the package it serves
    sessions: int = 0
    affinity: bool = True


@dataclass(frozen=True)
class Decision:
    """Where a request goes: ``node_id``, what kind of decision and a sentence for the log."""

    node_id: str
    action: Action
    reason: str

    @property
    def pins(self) -> bool:
        """True when the session's pin changes (placed or moved) and must be recorded."""
        return self.action in (Action.PLACED, Action.MOVED)


class NoNodeAvailable(Exception):
    """No healthy node serves the model; the message says why."""


def candidates(
    nodes: Iterable[NodeView], *, model: str, exclude: Mapping[str, str] | None = None
) -> list[NodeView]:
    """Nodes that may take a request for ``model``: up, serving it, weight > 0, not excluded."""
    excluded = exclude or {}
    return [
        n
        for n in nodes
        if n.state == "up" and n.model == model and n.weight > 0 and n.node_id not in excluded
    ]


def _load_key(node: NodeView) -> tuple[int, float, float, str]:
    unknown = node.load is None
    per_weight = 0.0 if node.load is None else node.load / node.weight
    return (1 if unknown else 0, per_weight, node.sessions / node.weight, node.node_id)


def least_loaded(nodes: Sequence[NodeView]) -> NodeView:
    """The node with the lowest load per weight (unknown load last); ``nodes`` must not be empty."""
    return min(nodes, key=_load_key)


def _placement_reason(verb: str, chosen: NodeView, pool: Sequence[NodeView]) -> str:
    if chosen.load is None:
        figure = "load unknown on every candidate"
    else:
        figure = f"lowest load {chosen.load / chosen.weight:.2f}"
    noun = "candidate" if len(pool) == 1 else "candidates"
    return f"{verb} {chosen.node_id}: {figure} of {len(pool)} {noun}"


def _why_not(node: NodeView | None, pinned: str, model: str, exclude: Mapping[str, str]) -> str:
    if node is None:
        return f"{pinned} removed"
    if node.node_id in exclude:
        return f"{pinned} {exclude[node.node_id]}"
    if node.state != "up":
        return f"{pinned} {node.state}"
    if node.model != model:
        return f"{pinned} does not serve {model}"
    return f"{pinned} has weight 0"


def route_request(
    nodes: Sequence[NodeView],
    *,
    model: str,
    pinned: str | None = None,
    session: bool = True,
    exclude: Mapping[str, str] | None = None,
) -> Decision:
    """Decide where a request for ``model`` goes.

    ``pinned`` is the node id the session is pinned to (None for a new session), ``session``
    False for a request without a session key (routed by load, never pinned), ``exclude`` maps
    node ids that already failed this request to a short reason ("unreachable: ConnectError").

    Raises ``NoNodeAvailable`` when no candidate is left.
    """
    excluded = exclude or {}
    pool = candidates(nodes, model=model, exclude=excluded)
    by_id = {n.node_id: n for n in nodes}
    if pinned is not None and any(n.node_id == pinned for n in pool):
        return Decision(pinned, Action.STUCK, f"stuck on {pinned}")
    if not pool:
        raise NoNodeAvailable(_no_node_message(nodes, model=model, exclude=excluded))
    chosen = least_loaded(pool)
    if not session:
        return Decision(chosen.node_id, Action.BALANCED, _placement_reason("sent to", chosen, pool))
    if pinned is None:
        return Decision(chosen.node_id, Action.PLACED, _placement_reason("placed on", chosen, pool))
    why = _why_not(by_id.get(pinned), pinned, model, excluded)
    return Decision(chosen.node_id, Action.MOVED, f"moved to {chosen.node_id}: {why}")


def _no_node_message(nodes: Sequence[NodeView], *, model: str, exclude: Mapping[str, str]) -> str:
    serving = [n for n in nodes if n.model == model]
    if not serving:
        return f"no node serves model {model!r}"
    states = ", ".join(
        f"{n.node_id} {exclude.get(n.node_id, n.state)}"
        for n in sorted(serving, key=lambda n: n.node_id)
    )
    return f"no healthy node serves model {model!r} ({states})"
