"""Prefix-aware placement end to end on the control plane: a node's published agents reach the
routing table through the control loop, and the proxy places a new session of that agent on it
(fake nodes)."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from inference.agent_prefix import agent_fingerprint
from inference.models import RouteDecision
from nodes.control import ControlLoop
from nodes.models import Node
from tests.inference.conftest import MODEL

pytestmark = pytest.mark.django_db(transaction=True)

SYSTEM = {"role": "system", "content": "You are the stock agent of a warehouse."}
TOOLS = [{"type": "function", "function": {"name": "count", "parameters": {"type": "object"}}}]


async def new_session(auth: dict, session: str, system: dict = SYSTEM):
    body = {"model": MODEL, "messages": [system, {"role": "user", "content": "hi"}], "tools": TOOLS}
    return await AsyncClient().post(
        "/v1/chat/completions",
        json.dumps(body),
        content_type="application/json",
        headers={**auth, "X-Session-Id": session},
    )


async def test_a_new_session_goes_to_the_node_that_published_its_agent(fakes, auth) -> None:
    agent = agent_fingerprint([SYSTEM], TOOLS)
    fakes[
        "node-02"
    ].metrics_text += f'phalanx_node_agent_prefix{{node="node-02",agent="{agent}"}} 1\n'
    await sync_to_async(ControlLoop().tick)()
    node = await Node.objects.aget(node_id="node-02")
    assert node.last_seen_load["prefixes"] == [agent]
    answer = await new_session(auth, "agent-1")
    assert answer.status_code == 200 and answer["X-Phalanx-Node"] == "node-02"
    decision = await RouteDecision.objects.filter(route__session_id="agent-1").alatest("id")
    assert "holds this agent's prefix" in decision.reason
    other = await new_session(auth, "other-1", {"role": "system", "content": "Another agent."})
    assert other["X-Phalanx-Node"] == "node-01"  # equal load: the first by id
