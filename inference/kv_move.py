"""A session's KV carried between nodes when its route moves off a live node (drain,
rebalance): exported from the node it leaves, imported on its new node, erased where it was,
before the turn is sent; the session's concurrent turns wait for the move to land. Used by
``inference.proxy`` once per attempt, never per token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import httpx

from console.lib.bare_http import db_thread
from inference import services
from inference.route_writer import route_writer
from nodes import client as node_client

log = logging.getLogger(__name__)

_record_kv_move = db_thread(services.route_record_kv_move)

KV_MOVE_TIMEOUT_S = 10.0  # export + import of one session's KV between two nodes
_kv_moves: dict[str, asyncio.Future[None]] = {}  # session id -> its KV move in flight


async def kv_in_place(
    target: services.RouteTarget, session_id: str | None, held: Any
) -> tuple[Any, Any]:
    """Before a turn is sent: a session moving to ``target`` has its KV moved there (the route
    committed first: ``(recorded, None)``); a turn behind a concurrent move waits for it to land
    (``(None, held)``)."""
    if target.kv_source and session_id:
        recorded = route_writer.commit(held)
        await _moving_kv(target, session_id, recorded)
        return recorded, None
    if session_id in _kv_moves:  # a concurrent turn carries the KV: send after it lands
        with contextlib.suppress(Exception):
            await asyncio.shield(_kv_moves[session_id])
    return None, held


async def _moving_kv(
    target: services.RouteTarget, session_id: str, recorded: asyncio.Future[None] | None
) -> None:
    """``_move_kv``, announced in ``_kv_moves`` so that the session's concurrent turns wait
    for it instead of starting the session afresh on the new node (its import would then be
    refused)."""
    move = asyncio.ensure_future(_move_kv(target, session_id, recorded))
    _kv_moves[session_id] = move
    try:
        await asyncio.shield(move)
    finally:
        if _kv_moves.get(session_id) is move:
            del _kv_moves[session_id]


async def _move_kv(
    target: services.RouteTarget, session_id: str, recorded: asyncio.Future[None] | None
) -> None:
    """Carry a moving session's KV from the node it leaves to its new node, then erase it there.

    Best effort: any failure (nothing held, session busy, budget) means the new node prefills
    from the transcript instead, which is always correct, only slower.
    """
    assert target.kv_source is not None and target.decision.previous is not None
    source = target.decision.previous
    try:
        blob = await node_client.session_export(
            target.kv_source, node_id=source, session_id=session_id, timeout=KV_MOVE_TIMEOUT_S
        )
        if blob is None:
            return
        imported = await node_client.session_import(
            target.address,
            node_id=target.node_id,
            session_id=session_id,
            blob=blob,
            timeout=KV_MOVE_TIMEOUT_S,
        )
    except httpx.HTTPError as exc:
        log.info("KV of %s not moved from %s: %s", session_id, source, exc)
        return
    await node_client.session_erase(
        target.kv_source, node_id=source, session_id=session_id, timeout=2.0
    )
    if recorded is not None:
        await asyncio.shield(recorded)  # the "moved" entry first, then "kv_moved"
    await _record_kv_move(
        session_id=session_id,
        node_id=target.node_id,
        reason=f"KV moved from {source} to {target.node_id}: "
        f"{imported.get('tokens', '?')} tokens, {len(blob)} bytes",
    )
