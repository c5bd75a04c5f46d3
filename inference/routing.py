"""Routing as pure functions over plain data: which node serves this request, and why.

Nothing here touches the database or the network; ``inference.services`` builds the
``NodeView`` list from the inventory and the ``Limits`` from the policy, and records the
``Decision``. Design notes: docs/control-plane.md, "Routing".

- Candidates are nodes that are ``up`` (not down, draining or unknown), serve the requested
  model, have weight > 0 and are not excluded for this request (a node that just failed it).
- A node's **score** (``node_score``) is its sequence load (the larger of the node's own
  ``(active + queued) / sequences`` and this process's open requests over sequences, which is
  fresher than the last scrape) plus ``PIN_WEIGHT`` x pinned sessions over its session capacity
  plus ``KV_WEIGHT`` x KV used over its KV budget. A node with no load signal has no score and is
  never taken for idle: it is only chosen when no candidate has a known score.
- A node is **full** for new sessions at ``max_sessions`` pinned sessions or at its explicit KV
  budget, and full for any request at ``max_inflight_per_node`` open requests. New sessions go
  to the non-full candidate with the lowest score per weight; when every candidate is full the
  request is refused (``Saturated``: 429 with Retry-After), never queued without bound.
- An existing session sticks to its node while it is a candidate. It moves when its node
  failed, drains or left the pool (every strategy but ``least_loaded``), or, under
  ``stick_and_rebalance``, when its node's score per weight is at or above
  ``overload_threshold`` *and* another node is at or below ``rebalance_target`` *and* the
  session did not move for load within the cooldown: the gap between the two thresholds and the
  cooldown are the hysteresis that stops sessions bouncing between nodes.
- ``least_loaded`` routes every request by score and never pins.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

PIN_WEIGHT = 0.5  # a node whose session capacity is fully pinned counts as half busy
KV_WEIGHT = 0.25  # a node whose KV budget is full counts as a quarter busy
# a node holding a new session's agent prefix counts this much less load: its first turn skips
# prefilling the system prompt (600 tokens: ~3.5 s on two cores, against ~0.1 s of a turn's own
# text), worth sending it to a node half a node's sequences busier, not more
PREFIX_CREDIT = 0.5

STICK_AND_REDIRECT = "stick_and_redirect"
STICK_AND_REBALANCE = "stick_and_rebalance"
LEAST_LOADED = "least_loaded"


class Action(StrEnum):
    PLACED = "placed"  # a new session pinned to a node
    STUCK = "stuck"  # an existing session stays on its node
    MOVED = "moved"  # an existing session redirected to another node
    BALANCED = "balanced"  # a request without a session key (or least_loaded), not pinned


@dataclass(frozen=True)
class NodeView:
    """What routing needs to know about a node.

    ``load``: the node's own sequence load from its metrics (0 idle, 1 every sequence busy,
    above 1 queueing) or ``None`` when unknown. ``sessions``: sessions pinned to it.
    ``total``: configured sequences (None when unknown). ``kv_used`` / ``kv_capacity``: KV tokens
    from its metrics. ``max_sessions`` / ``kv_budget``: operator limits (0 = none).
    ``inflight``: requests this control-plane process has open to it right now.
    ``prefill_speed``: prompt tokens/s it prefills at (None until measured).
    """

    node_id: str
    state: str  # "up" | "down" | "draining" | "unknown"
    weight: float
    load: float | None
    model: str | None  # the name clients ask for (its family: inference.model_names)
    sessions: int = 0
    affinity: bool = True
    total: float | None = None
    kv_used: float | None = None
    kv_capacity: float | None = None
    max_sessions: int = 0
    kv_budget: int = 0
    inflight: int = 0
    prefill_speed: float | None = None
    package_id: int | None = None  # the package version it serves
    # the agents whose prefix KV it holds (``inference.agent_prefix`` fingerprints)
    prefixes: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Limits:
    """The routing policy's knobs, as plain data (see ``RoutingPolicy``)."""

    strategy: str = STICK_AND_REDIRECT
    overload_threshold: float = 1.5
    rebalance_target: float = 0.5
    max_inflight_per_node: int = 0  # 0: no limit


@dataclass(frozen=True)
class Decision:
    """Where a request goes: ``node_id``, what kind of decision and a sentence for the log.

    ``for_load`` is True for a move off an overloaded node (starts the session's cooldown);
    ``previous`` is the node the session leaves on a move.
    """

    node_id: str
    action: Action
    reason: str
    for_load: bool = False
    previous: str | None = None

    @property
    def pins(self) -> bool:
        """True when the session's pin changes (placed or moved) and must be recorded."""
        return self.action in (Action.PLACED, Action.MOVED)


class NoNodeAvailable(Exception):
    """No healthy node serves the model; the message says why."""


class Saturated(Exception):
    """Every healthy node for the model is at a hard limit; the message says which."""


def candidates(
    nodes: Iterable[NodeView],
    *,
    model: str,
    exclude: Mapping[str, str] | None = None,
    version: int | None = None,
) -> list[NodeView]:
    """Nodes that may take a request for ``model``: up, serving it, weight > 0, not excluded;
    with ``version`` (a package id), only the nodes serving that version when any of them
    may (a session keeps its model version while a node of it is up; only when none is left
    does it go to another)."""
    excluded = exclude or {}
    pool = [
        n
        for n in nodes
        if n.state == "up" and n.model == model and n.weight > 0 and n.node_id not in excluded
    ]
    if version is not None:
        same = [n for n in pool if n.package_id == version]
        return same or pool
    return pool


@dataclass(frozen=True)
class Rollout:
    """An upgrade under way for a model: new sessions go to ``new_package_id`` with
    probability ``new_share`` (0..1), else to ``old_package_id``."""

    old_package_id: int
    new_package_id: int
    new_share: float


def version_for_new_session(session_id: str, rollout: Rollout) -> int:
    """The version a new session starts on: a stable bucket of its id (the same session
    always lands in the same bucket) against the rollout's share."""
    bucket = int(hashlib.sha256(session_id.encode()).hexdigest()[:8], 16) / 2**32
    return rollout.new_package_id if bucket < rollout.new_share else rollout.old_package_id


def score_parts(node: NodeView) -> tuple[float, float, float] | None:
    """The three terms of ``node_score``: sequences, pinned sessions, KV (None when unknown)."""
    if node.load is None:
        return None
    seq = node.load
    if node.total:
        seq = max(seq, node.inflight / node.total)
    capacity = node.max_sessions or node.total or 0
    pins = node.sessions / capacity if capacity else 0.0
    budget = node.kv_budget or node.kv_capacity or 0
    kv = (node.kv_used or 0.0) / budget if budget else 0.0
    return seq, PIN_WEIGHT * pins, KV_WEIGHT * kv


def node_score(node: NodeView) -> float | None:
    """Load figure of a node (unitless, 0 idle, 1 busy), or None when its load is unknown.

    ``max(load, inflight / total) + PIN_WEIGHT * pinned / capacity + KV_WEIGHT * kv / budget``;
    capacity is ``max_sessions`` or else the sequences; budget is ``kv_budget`` or else the
    node's KV capacity. Terms whose denominator is unknown count 0.
    """
    parts = score_parts(node)
    return None if parts is None else sum(parts)


def per_weight(node: NodeView) -> float | None:
    """``node_score / weight`` (None when unknown)."""
    score = node_score(node)
    return None if score is None else score / node.weight


def _load_key(node: NodeView) -> tuple[int, float, float, str]:
    figure = per_weight(node)
    return (
        1 if figure is None else 0,
        0.0 if figure is None else figure,
        node.sessions / node.weight,
        node.node_id,
    )


def least_loaded(nodes: Sequence[NodeView], prefix: str | None = None) -> NodeView:
    """The node with the lowest score per weight (unknown last); ``nodes`` must not be empty.

    ``prefix``: the request's agent (``inference.agent_prefix``); a node that holds its prefix
    counts ``PREFIX_CREDIT`` less load, so a new session of a known agent goes where its system
    prompt is cached unless that node is loaded by more than the credit (cached overlap
    against load, as llm-d's and Dynamo's KV-aware routers score it)."""
    return min(nodes, key=lambda n: _credited_key(n, prefix))


def holds_prefix(node: NodeView, prefix: str | None) -> bool:
    return bool(prefix) and prefix in node.prefixes


def _credited_key(node: NodeView, prefix: str | None) -> tuple[int, float, float, str]:
    unknown, figure, pinned, node_id = _load_key(node)
    if holds_prefix(node, prefix) and not unknown:
        figure -= PREFIX_CREDIT
    return unknown, figure, pinned, node_id


def busy_for_request(node: NodeView, limits: Limits) -> str | None:
    """Why ``node`` cannot take one more request right now, or None."""
    if limits.max_inflight_per_node and node.inflight >= limits.max_inflight_per_node:
        return f"{node.inflight}/{limits.max_inflight_per_node} requests open"
    return None


def full_for_session(node: NodeView, limits: Limits) -> str | None:
    """Why ``node`` cannot take a new session right now, or None."""
    if node.max_sessions and node.sessions >= node.max_sessions:
        return f"{node.sessions}/{node.max_sessions} sessions"
    if node.kv_budget and node.kv_used is not None and node.kv_used >= node.kv_budget:
        return f"KV {node.kv_used:.0f}/{node.kv_budget} tokens"
    return busy_for_request(node, limits)


def _placement_reason(
    verb: str, chosen: NodeView, pool: Sequence[NodeView], prefix: str | None = None
) -> str:
    figure_value = per_weight(chosen)
    if figure_value is None:
        figure = "load unknown on every candidate"
    elif holds_prefix(chosen, prefix):
        figure = f"holds this agent's prefix, load {figure_value:.2f} - {PREFIX_CREDIT:.2f}"
    else:
        figure = f"lowest load {figure_value:.2f}"
    noun = "candidate" if len(pool) == 1 else "candidates"
    return f"{verb} {chosen.node_id}: {figure} of {len(pool)} {noun}{_breakdown(chosen)}"


def _breakdown(node: NodeView) -> str:
    """`` (sequences 0.10 + pinned 0.25 + KV 0.02)`` when more than the sequence load counts."""
    parts = score_parts(node)
    if parts is None:
        return ""
    seq, pins, kv = (round(p, 2) for p in parts)  # what the sentence shows
    if not (pins or kv):
        return ""
    terms = [f"sequences {seq:.2f}", f"{node.sessions} pinned {pins:.2f}"]
    if kv:
        terms.append(f"KV {kv:.2f}")
    return f" ({' + '.join(terms)})"


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


def _rebalance(current: NodeView, pool: Sequence[NodeView], limits: Limits) -> Decision | None:
    here = per_weight(current)
    if here is None or here < limits.overload_threshold:
        return None
    others = [
        n
        for n in pool
        if n.node_id != current.node_id
        and full_for_session(n, limits) is None
        and (per_weight(n) is not None)
        and per_weight(n) <= limits.rebalance_target  # type: ignore[operator]
    ]
    if not others:
        return None
    target = least_loaded(others)
    reason = (
        f"moved to {target.node_id}: {current.node_id} overloaded (load {here:.2f} >= "
        f"{limits.overload_threshold:g}), {target.node_id} at {per_weight(target):.2f}"
    )
    return Decision(target.node_id, Action.MOVED, reason, for_load=True, previous=current.node_id)


def route_request(
    nodes: Sequence[NodeView],
    *,
    model: str,
    pinned: str | None = None,
    session: bool = True,
    exclude: Mapping[str, str] | None = None,
    limits: Limits | None = None,
    may_move_for_load: bool = True,
    version: int | None = None,
    prefix: str | None = None,
) -> Decision:
    """Decide where a request for ``model`` goes (among the nodes of package ``version``
    while any of them may take it: ``candidates``); a request that is placed (not kept on
    its node) prefers a node holding its agent's ``prefix`` (``least_loaded``).

    ``pinned`` is the node id the session is pinned to (None for a new session), ``session``
    False for a request without a session key (routed by load, never pinned), ``exclude`` maps
    node ids that already failed this request to a short reason ("unreachable: ConnectError"),
    ``limits`` the policy's knobs, ``may_move_for_load`` False while the session's cooldown runs.

    Raises ``NoNodeAvailable`` when no candidate is left, ``Saturated`` when every candidate is
    at a hard limit (or the pinned node is at its open-request limit).
    """
    limits = limits or Limits()
    excluded = exclude or {}
    pool = candidates(nodes, model=model, exclude=excluded, version=version)
    by_id = {n.node_id: n for n in nodes}
    if limits.strategy == LEAST_LOADED:
        session, pinned = False, None
    current = next((n for n in pool if n.node_id == pinned), None)
    if current is not None:
        return _stay_on(current, pool, limits, may_move_for_load=may_move_for_load)
    if not pool:
        raise NoNodeAvailable(_no_node_message(nodes, model=model, exclude=excluded))
    check = full_for_session if session else busy_for_request
    open_pool = [n for n in pool if check(n, limits) is None]
    if not open_pool and version is not None:  # every node of its version is full: any
        pool = candidates(nodes, model=model, exclude=excluded)
        open_pool = [n for n in pool if check(n, limits) is None]
    if not open_pool:
        states = ", ".join(f"{n.node_id} {check(n, limits)}" for n in pool)
        raise Saturated(f"every node serving {model!r} is full ({states})")
    chosen = least_loaded(open_pool, prefix)
    if not session:
        reason = _placement_reason("sent to", chosen, open_pool, prefix)
        return Decision(chosen.node_id, Action.BALANCED, reason)
    if pinned is None:
        reason = _placement_reason("placed on", chosen, open_pool, prefix)
        return Decision(chosen.node_id, Action.PLACED, reason)
    why = _why_not(by_id.get(pinned), pinned, model, excluded)
    return Decision(
        chosen.node_id, Action.MOVED, f"moved to {chosen.node_id}: {why}", previous=pinned
    )


def _stay_on(
    current: NodeView, pool: Sequence[NodeView], limits: Limits, *, may_move_for_load: bool
) -> Decision:
    """The decision for a session whose pinned node ``current`` is still a candidate: stuck
    there, or moved for load (``STICK_AND_REBALANCE``, outside the cooldown). Raises
    ``Saturated`` when ``current`` is at its open-request limit."""
    busy = busy_for_request(current, limits)
    if busy is not None:
        raise Saturated(f"{current.node_id}, where the session is pinned, has {busy}")
    if limits.strategy == STICK_AND_REBALANCE and may_move_for_load:
        moved = _rebalance(current, pool, limits)
        if moved is not None:
            return moved
    return Decision(current.node_id, Action.STUCK, f"stuck on {current.node_id}")


def _no_node_message(nodes: Sequence[NodeView], *, model: str, exclude: Mapping[str, str]) -> str:
    serving = [n for n in nodes if n.model == model]
    if not serving:
        return f"no node serves model {model!r}"
    states = ", ".join(
        f"{n.node_id} {exclude.get(n.node_id, n.state)}"
        for n in sorted(serving, key=lambda n: n.node_id)
    )
    return f"no healthy node serves model {model!r} ({states})"


@dataclass(frozen=True)
class SessionPin:
    """What the routing table holds about a session: the node it is pinned to (None when new or
    released), seconds since its last request, and whether a move-for-load cooldown runs."""

    node_id: str | None = None
    idle_s: float = 0.0
    cooling: bool = False


@dataclass(frozen=True)
class SessionPlan:
    """A session's routing for one request: the ``decision``, and ``released`` (a sentence for
    the log) when its pin was dropped first for being idle longer than the policy allows."""

    decision: Decision
    released: str | None = None


def route_session(
    nodes: Sequence[NodeView],
    *,
    model: str,
    pin: SessionPin,
    idle_release_s: float,
    exclude: Mapping[str, str] | None = None,
    limits: Limits | None = None,
    version: int | None = None,
    prefix: str | None = None,
) -> SessionPlan:
    """``route_request`` for a session whose pin is ``pin`` (and model ``version``): a pin idle for longer than
    ``idle_release_s`` seconds is released first (the session is placed afresh); a running
    cooldown forbids a move for load. Raises what ``route_request`` raises."""
    released = None
    pinned = pin.node_id
    if pinned is not None and pin.idle_s > idle_release_s:
        released = f"released from {pinned}: idle {pin.idle_s:.0f} s"
        pinned = None
    decision = route_request(
        nodes,
        model=model,
        pinned=pinned,
        exclude=exclude,
        limits=limits,
        may_move_for_load=not pin.cooling,
        version=version,
        prefix=prefix,
    )
    return SessionPlan(decision, released)
