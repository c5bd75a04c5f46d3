"""The inference proxy's core, shared by the REST view and the session websocket.

``upstream_open`` routes a chat request, sends it to the chosen node and waits for the node's
first body bytes; a failure before that point (refused, timed out, overloaded, no first byte
within the request's deadline) is retried on another node (with backoff), bumping the failed
node's failure counter when it was refused or timed out; a node's 500 for one request is that
request's failure (``node_refusals.refused``); a node marked down while the request waits (a stopped
process) is given up. A session that moves off a live node (drain, rebalance) takes its KV
along (``inference.kv_move``: export, import, erase); a session whose last turn broke on a
node is kept off it. After the first byte the request is committed to its node:
``inference.relay`` relays and checks the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

from console.lib import logs
from console.lib.bare_http import db_thread
from console.lib.metrics import metric_inc
from inference import lookups, services
from inference.agent_prefix import agent_fingerprint
from inference.control_plane_metrics import PROXY_RETRIES
from inference.deadlines import FirstByteDeadline, first_byte_deadline, uncached_prompt_chars
from inference.errors import ArrayFull, NoHealthyNode
from inference.kv_move import kv_in_place
from inference.models import RoutingPolicy
from inference.node_refusals import (
    REFUSALS,
    FirstByteLate,
    NodeWentDown,
    failed_before_first_byte,
    refused,
)
from inference.node_table import NodeTable, nodes_for_routing
from inference.placement import claim_pin, pin_version, replicas_share_placements
from inference.relay import (
    Upstream,
    broken_turns,
    inflight,
    refuse_poison,
)
from inference.request_breaker import request_breaker
from inference.route_writer import route_writer
from nodes import client as node_client
from nodes.models import Node

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 1.0


def _deadline(
    target: services.RouteTarget, payload: dict[str, Any], policy: RoutingPolicy
) -> FirstByteDeadline | None:
    """The first-byte deadline of a streamed request on ``target`` (None when not streamed)."""
    if not payload.get("stream"):
        return None
    chars = uncached_prompt_chars(
        payload.get("messages") or (), cached_on_node=target.decision.action == "stuck"
    )
    return first_byte_deadline(
        uncached_chars=chars,
        prefill_speed=target.prefill_speed,
        floor_s=policy.first_byte_floor_s,
        margin=policy.first_byte_margin,
        cap_s=policy.request_timeout_s,
    )


@db_thread
def _read_routing(
    session_id: str | None, *, model: str, policy: RoutingPolicy
) -> tuple[services.RouteRow | None, float, NodeTable, Any]:
    """The session's row, when its read started (``time.monotonic()``), the node table and
    the rollout of an upgrade of ``model`` under way (None without a session or upgrade)."""
    table = nodes_for_routing(
        stale_after_s=services.routing_stale_after_s(policy), pinned=lookups.pinned_counts_cached()
    )
    rollout = lookups.rollout_for(model) if session_id else None
    row_read_at = time.monotonic()
    row = services.route_read(session_id=session_id) if session_id else None
    return row, row_read_at, table, rollout


async def _route(
    *,
    session_id: str | None,
    model: str,
    exclude: dict[str, str],
    new_turn: bool,
    policy: RoutingPolicy,
    continuing: bool = False,
    prefix: str | None = None,
) -> tuple[services.RouteTarget, Any]:
    """Decide the node for one attempt (``continuing``: an answer cut on another node goes on,
    so external servers, which cannot continue an assistant message, are kept out) and hold its record in ``route_writer``'s ledger;
    returns the target and the held change (None without a session) for ``commit``. Only the
    reads leave the event loop: the decision and the hold run with no await between them, so
    concurrent decisions of this process see each other, and nobody waits for a write."""
    row, row_read_at, table, rollout = await _read_routing(session_id, model=model, policy=policy)
    if session_id is not None:
        row = route_writer.pin_of(session_id, row, read_at=row_read_at)
    if continuing:
        exclude.update({n: CANNOT_CONTINUE for n in table.external if n not in exclude})
    table = table.with_local_counts(
        pinned_delta=route_writer.pinned_delta(read_at=table.pinned_read_at),
        inflight=inflight.per_node(),
    )
    plan = functools.partial(
        services.route_plan,
        session_id=session_id,
        table=table,
        model=model,
        policy=policy,
        exclude=exclude,
        new_turn=new_turn,
        rollout=rollout,
        prefix=prefix,
    )
    target = _claimed(plan, row, exclude, plan(row=row), table)
    held = route_writer.hold(target.record) if target.record is not None else None
    return target, held


def _claimed(
    plan: Callable[..., services.RouteTarget],
    row: services.RouteRow | None,
    exclude: dict[str, str],
    target: services.RouteTarget,
    table: NodeTable,
) -> services.RouteTarget:
    """``target``, or, when another control-plane replica claimed this session's pin change
    first (``placement.claim_pin``), the same pin change onto the winner's node: planned again
    with every other node kept out, so this replica records the placement (or move) it would
    have written had it won. When the winner's node cannot take the turn here, ``target``."""
    decision = target.decision
    session_id = target.record.session_id if target.record is not None else None
    if session_id is None or not decision.pins or not replicas_share_placements():
        return target
    winner = claim_pin(session_id=session_id, pin=pin_version(row), node_id=decision.node_id)
    if winner == decision.node_id:
        return target
    others = {v.node_id: WINNER_ELSEWHERE for v in table.views if v.node_id != winner}
    try:
        return plan(row=row, exclude={**others, **exclude})  # the real reasons win
    except (NoHealthyNode, ArrayFull):  # not usable from here: this replica's own choice
        return target


CANNOT_CONTINUE = "is an external server: it cannot continue a cut answer"
WINNER_ELSEWHERE = "another control-plane replica placed the session first"


BROKE_LAST_TURN = "broke the session's last turn"


async def _route_avoiding(
    *, exclude: dict[str, str], **route: Any
) -> tuple[services.RouteTarget, Any]:
    """``_route`` (same arguments); a node kept out only because it broke the session's last
    turn is taken back when no other node can serve (a one-node array still answers)."""
    try:
        return await _route(exclude=exclude, **route)
    except (NoHealthyNode, ArrayFull):
        avoided = [n for n, why in exclude.items() if why == BROKE_LAST_TURN]
        if not avoided:
            raise
        for node_id in avoided:
            del exclude[node_id]
        return await _route(exclude=exclude, **route)


@db_thread
def _node_is_down(node_id: str) -> bool:
    return Node.objects.filter(node_id=node_id, state=Node.State.DOWN).exists()


async def _open_first(
    target: services.RouteTarget,
    *,
    payload: dict[str, Any],
    model: str,
    session_id: str | None,
    policy: RoutingPolicy,
    request_id: str | None = None,
) -> tuple[httpx.Response, AsyncIterator[bytes] | None, bytes]:
    """Send ``payload`` to ``target`` (its model named as the node knows it; the answer
    reports ``model`` and the package) and read up to the first body bytes (or the whole body
    of a 5xx, a 429, a 401 or a 403, returned with no iterator: ``node_refusals.refused``
    judges those)."""
    response = await node_client.chat_open(
        target.address,
        node_id=target.node_id,
        payload={**payload, "model": target.model},
        session_id=session_id,
        connect_timeout=policy.connect_timeout_s,
        read_timeout=policy.request_timeout_s,
        answer_as=(model, target.package) if target.package else None,
        request_id=request_id,
    )
    try:
        if response.status_code >= 500 or response.status_code in REFUSALS:
            await response.aread()
            await node_client.chat_close(response)
            return response, None, b""
        rest = response.aiter_raw()
        return response, rest, await anext(rest, b"")
    except BaseException:
        await node_client.chat_close(response)
        raise


async def _watched(
    node_id: str, opening: Any, *, policy: RoutingPolicy, deadline: FirstByteDeadline | None
) -> tuple[httpx.Response, AsyncIterator[bytes] | None, bytes]:
    """Await ``opening`` (``_open_first``), checking every half health-check interval (at
    least 0.2 s) whether the control loop marked the node down meanwhile (a stopped process accepts connections but
    never answers); then raises ``NodeWentDown``. Past ``deadline`` (None: none) raises
    ``FirstByteLate``. Cancelling closes the node's response."""
    task = asyncio.ensure_future(opening)
    check_every_s = max(0.2, policy.health_interval_s / 2)
    give_up_at = time.monotonic() + deadline.seconds if deadline else float("inf")
    try:
        while True:
            wait = min(check_every_s, max(0.0, give_up_at - time.monotonic()))
            done, _ = await asyncio.wait({task}, timeout=wait)
            if done:
                return task.result()
            if time.monotonic() >= give_up_at:
                assert deadline is not None
                raise FirstByteLate(deadline.why)
            if await _node_is_down(node_id):
                raise NodeWentDown(node_id)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


def _check_inflight(policy: RoutingPolicy) -> None:
    """Raises ``ArrayFull`` (429, Retry-After 1 s) when this process already holds
    ``policy.max_inflight`` requests (0: no limit)."""
    if policy.max_inflight and inflight.total >= policy.max_inflight:
        raise ArrayFull(
            f"The control plane has {inflight.total} requests open (max_inflight "
            f"{policy.max_inflight}); retry shortly.",
            retry_after=1,
        )


async def upstream_open(
    *,
    payload: dict[str, Any],
    model: str,
    session_id: str | None,
    policy: RoutingPolicy | None = None,
    avoid: dict[str, str] | None = None,
    continuing: bool = False,
    request_id: str | None = None,
    ticket: Any = None,
) -> Upstream:
    """Route ``payload`` (an OpenAI chat body) for ``model`` (a client-facing name:
    ``lookups.model_for_request``) and open the node's answer, which reports ``model`` and the
    version that serves it (``Upstream.package``). ``avoid``: nodes kept out, with why;
    ``continuing``: the body goes on with an answer another node cut (``inference.migration``:
    Phalanx nodes only); ``request_id`` goes to the node (``X-Request-Id``); ``ticket``
    (``usage.turns.Ticket``) counts the turn against its caller. Tries at most
    ``policy.max_attempts`` nodes (``_back_off`` between). A node's 4xx is returned as is (the
    caller passes it on); connection failures, timeouts, overload (503, 429) and a node marked
    down while we wait move to the next node. A 503 (queue full) from the node a session is pinned to is passed
    on as 503 with Retry-After instead: the session keeps its KV and its node. Any other 5xx
    raises ``UpstreamError`` (502 ``node_error``) without a retry (``node_refusals.refused``).
    Raises ``ArrayFull`` (429) when this process holds ``max_inflight`` requests or every node
    is at its limits, ``NoHealthyNode`` (503) when no node is left; both carry ``retry_after``.
    ``policy`` saves a read when the caller already has it.
    """
    policy = policy or await lookups.arouting_policy()
    if ticket is None or not ticket.gated:  # a gated turn holds a slot of max_inflight
        _check_inflight(policy)
    refuse_poison(payload)
    exclude = _kept_out(avoid, session_id)
    for attempt in range(policy.max_attempts):
        if attempt:
            await _back_off(attempt, policy)
        target, held = await _route_avoiding(
            session_id=session_id,
            model=model,
            exclude=exclude,
            new_turn=attempt == 0,
            policy=policy,
            continuing=continuing,
            prefix=agent_fingerprint(payload.get("messages"), payload.get("tools")),
        )
        upstream = await _attempt(
            target,
            held,
            payload=payload,
            model=model,
            session_id=session_id,
            policy=policy,
            exclude=exclude,
            request_id=request_id,
            ticket=ticket,
        )
        if upstream is not None:
            return upstream
    raise _none_could(exclude, policy)


def _none_could(exclude: dict[str, str], policy: RoutingPolicy) -> NoHealthyNode:
    """The 503 when every node tried refused or failed, naming each with why."""
    tried = "; ".join(f"{node} {why}" for node, why in exclude.items())
    return NoHealthyNode(
        f"No node could take the request ({tried}).",
        retry_after=max(1, round(policy.health_interval_s)),
    )


async def _back_off(attempt: int, policy: RoutingPolicy) -> None:
    """Wait before try ``attempt`` (1, 2, ...): ``retry_backoff_ms``, doubling, at most 1 s."""
    metric_inc(PROXY_RETRIES)
    await asyncio.sleep(min(MAX_BACKOFF_S, policy.retry_backoff_ms / 1000 * 2 ** (attempt - 1)))


def _let_go(node_id: str, held: Any) -> None:
    """A request that will not be relayed from ``node_id``: its slot back, its route held
    in ``route_writer`` written."""
    inflight.release(node_id)
    route_writer.commit(held)


def _kept_out(avoid: dict[str, str] | None, session_id: str | None) -> dict[str, str]:
    """The nodes a request starts without, with why: ``avoid`` (a migration's: the node
    that broke the session's last turn is then left in ``broken_turns`` for the next turn,
    should this one fail too), else that node."""
    exclude = dict(avoid or {})
    if avoid:  # a migration: the memory stays for the next turn, should this one fail too
        return exclude
    broke_last_turn = broken_turns.take(session_id)
    if broke_last_turn and broke_last_turn not in exclude:
        exclude[broke_last_turn] = BROKE_LAST_TURN
    return exclude


async def _attempt(
    target: services.RouteTarget,
    held: Any,
    *,
    payload: dict[str, Any],
    model: str,
    session_id: str | None,
    policy: RoutingPolicy,
    exclude: dict[str, str],
    request_id: str | None = None,
    ticket: Any = None,
) -> Upstream | None:
    """Send the request to ``target`` and wait for its first byte. Returns the open answer, or
    None after adding the node to ``exclude`` with the reason (the caller tries another).
    Raises ``NoHealthyNode`` (503 ``node_busy``) when the node a session sticks to is busy."""
    recorded, held = await kv_in_place(target, session_id, held)
    deadline = _deadline(target, payload, policy)
    logs.bind(node_id=target.node_id, package=target.package)
    inflight.acquire(target.node_id)
    opening = _open_first(
        target,
        payload=payload,
        model=model,
        session_id=session_id,
        policy=policy,
        request_id=request_id,
    )
    try:
        response, rest, first = await _watched(
            target.node_id, opening, policy=policy, deadline=deadline
        )
    except BaseException as exc:
        _let_go(target.node_id, held)
        await failed_before_first_byte(exc, target.node_id, payload, policy, exclude)
        return None
    if rest is None:  # 5xx or 429
        _let_go(target.node_id, held)
        return await refused(target, response, payload=payload, policy=policy, exclude=exclude)
    request_breaker.success(target.node_id)
    return Upstream(
        target.node_id,
        target.decision,
        response.status_code,
        response.headers,
        first,
        rest,
        response,
        policy.failure_threshold,
        list(exclude),
        held,
        recorded,
        payload,
        session_id,
        target.package,
        model=model,
        first_token_deadline_s=deadline.seconds if deadline else None,
        request_id=request_id,
        ticket=ticket,
    )
