"""The bake's numbers end to end: the node agent counts what its requests came to
(``nodes.agent.app._record`` into ``Outcomes``) and exposes it on its real ``/metrics``
(``NodeApp`` over ASGI, ``nodes.agent.metrics``); the control loop's health tick scrapes it
(``nodes.client.probe``, ``nodes.metrics``); the upgrade's bake compares old and new from
that and rolls a version that fails more, breaks more tool calls or answers slower back.
Only the engine (its request counter and sequences) and the switch are simulated."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from inference.engine.request import Failed, Finished
from inference.models import RoutingPolicy, Upgrade
from inference.upgrades import driver, services
from nodes import client as node_client
from nodes.agent.app import NodeApp
from nodes.agent.auth import CredentialCheck
from nodes.agent.chat_endpoint import _record
from nodes.agent.node_state import NodeIdentity
from nodes.control import ControlLoop
from nodes.credentials import node_credential
from nodes.models import Node

pytestmark = pytest.mark.django_db
REAL_PROBE = node_client.probe  # the fleet fixture simulates it; here the node answers


@dataclass
class Engine:
    """What ``NodeApp`` reads of an engine for ``/health`` and ``/metrics``."""

    requests_total: int = 0
    ready: threading.Event = field(default_factory=threading.Event)
    load_error: str = ""

    def snapshot(self) -> dict:
        return {
            "requests_total": self.requests_total,
            "sequences_total": 4,
            "sequences_active": 0,
            "queue_depth": 0,
            "kv_settings": {},
            "tuning": None,
            "repeatable": True,
            "host_ram_budget_bytes": 0,
            "warm": {},
        }


class Shaper:
    """The completion shaper's verdict on a tool call (``CompletionShaper.tool_call_broken``)."""

    def tool_call_broken(self, text: str) -> bool:
        return text == "<tool_call>{broken"


class Array:
    """One ``NodeApp`` per node, reached by the control plane's sync HTTP client."""

    def __init__(self, node_ids: list[str]) -> None:
        self.apps: dict[str, NodeApp] = {}
        self.engines: dict[str, Engine] = {}
        for node_id in node_ids:
            engine = Engine()
            engine.ready.set()
            self.engines[node_id] = engine
            self.apps[node_id] = NodeApp(
                NodeIdentity(node_id=node_id, package="smol"),
                engine,
                lambda engine: None,
                CredentialCheck(env_value=node_credential(node_id)),
            )
        self.by_address = {n.address: n.node_id for n in Node.objects.filter(node_id__in=node_ids)}

    def handle(self, request: httpx.Request) -> httpx.Response:
        app = self.apps[self.by_address[request.url.netloc.decode()]]

        async def call() -> httpx.Response:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://node") as http:
                answer = await http.get(request.url.path, headers=dict(request.headers))
                return httpx.Response(answer.status_code, content=answer.content)

        return asyncio.run(call())

    def traffic(self, node_id: str, *, kind: str) -> None:
        """Six chat requests on the node, as its engine ends them: ``kind`` "ok" (TTFT 100 ms),
        "failing" (two engine failures), "tool" (two broken tool calls), "slow" (TTFT 3 s)."""
        self.engines[node_id].requests_total += 6
        outcomes = self.apps[node_id].outcomes
        for i in range(6):
            ttft = 3000.0 if kind == "slow" else 100.0
            text = "<tool_call>{broken" if kind == "tool" and i < 2 else "ok"
            result = Finished(text, "stop", 10, 0, 3, {"ttft_ms": ttft})
            if kind == "failing" and i < 2:
                result = Failed("llama_decode returned -1")
            _record(outcomes, result, Shaper())


@pytest.fixture
def array(fleet, monkeypatch) -> Iterator[Array]:
    """The fleet's three nodes as real ``NodeApp``s behind the control plane's HTTP client."""
    monkeypatch.setattr(node_client, "probe", REAL_PROBE)
    array = Array(["n1", "n2", "n3"])
    http = httpx.Client(transport=httpx.MockTransport(array.handle), trust_env=False)
    monkeypatch.setattr(node_client, "sync_client", lambda: http)
    policy = RoutingPolicy.load()
    policy.canary_idle_s = 0  # no canary completions: the simulated engine takes none
    policy.save()
    yield array
    http.close()


@pytest.mark.parametrize(
    ("kind", "gate", "reason"),
    [
        ("failing", "error_rate", "error rate 33.3% (new) against 0.0% (old)"),
        ("tool", "tool_parse", "tool calls that did not parse 33.3% (new) against 0.0% (old)"),
        ("slow", "ttft_p95", "TTFT P95 3.00 s (new) against 0.10 s (old)"),
    ],
)
def test_a_version_whose_node_counters_move_the_wrong_way_bakes_red_and_rolls_back(
    fleet, packages, array, kind, gate, reason
):
    old, new = packages
    upgrade = services.upgrade_start(
        from_package_id=old.pk, to_package_id=new.pk, settings={"bake_s": 0}
    )
    loop = ControlLoop()
    for _ in range(60):
        for node_id in array.apps:
            on_new = fleet.serving[node_id] == new.sha256
            array.traffic(node_id, kind=kind if on_new else "ok")
        assert set(loop.tick().statuses.values()) == {"ok"}
        driver.upgrades_tick()
        row = Upgrade.objects.get(pk=upgrade.pk)
        if row.finished:
            break
    assert row.state == "rolled_back", row.reason
    assert row.reason.startswith(f"bake of batch 1: {reason}"), row.reason
    assert [g["gate"] for g in row.gates if not g["passed"]] == [gate]
    assert all(n.package == old for n in Node.objects.all())


def test_a_version_that_does_as_well_bakes_green_on_the_scraped_counters(fleet, packages, array):
    old, new = packages
    upgrade = services.upgrade_start(
        from_package_id=old.pk, to_package_id=new.pk, settings={"bake_s": 0}
    )
    loop = ControlLoop()
    for _ in range(60):
        for node_id in array.apps:
            array.traffic(node_id, kind="ok")
        loop.tick()
        driver.upgrades_tick()
        row = Upgrade.objects.get(pk=upgrade.pk)
        if row.finished:
            break
    assert row.state == "succeeded", row.reason
    bake = [g for g in row.gates if g["gate"] == "error_rate"]
    assert bake and bake[0]["detail"] == "error rate 0.0% (new) against 0.0% (old), at most 2.0%"
    ttft = [g for g in row.gates if g["gate"] == "ttft_p95"]
    assert ttft and ttft[0]["values"]["new"] == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("kind", "line"),
    [
        ("failing", "phalanx_node_failed_requests_total 2"),
        ("tool", "phalanx_node_tool_parse_failures_total 2"),
        ("slow", "phalanx_node_ttft_p95_seconds 3"),
        ("ok", "phalanx_node_requests_total 6"),
    ],
)
def test_the_node_exposes_the_bake_counters_under_their_documented_names(fleet, array, kind, line):
    """The names docs/node-protocol.md gives (what an external node must expose too), spelled
    out here: renaming the shared constant breaks this, not only the docs."""
    from nodes.agent import metrics

    array.traffic("n1", kind=kind)
    node = Node.objects.get(node_id="n1")
    request = httpx.Request(
        "GET",
        f"http://{node.address}/metrics",
        headers={"Authorization": f"Bearer {node_credential('n1')}"},
    )
    lines = array.handle(request).text.splitlines()
    name, value = line.split()
    found = [x.split()[-1] for x in lines if x.split(" ")[0].split("{")[0] == name]
    assert [float(v) for v in found] == [pytest.approx(float(value))], lines
    protocol = (Path(__file__).parents[3] / "docs" / "node-protocol.md").read_text()
    assert name in protocol
    assert name in {
        metrics.REQUESTS_TOTAL,
        metrics.FAILED_REQUESTS_TOTAL,
        metrics.TOOL_PARSE_FAILURES_TOTAL,
        metrics.TTFT_P95_SECONDS,
    }
