"""Mutual authentication between the control plane and a node (issue 30): the node answers
each call's challenge with a proof keyed by what only it and the control plane hold, and the
control plane refuses an answer that does not prove the node (docs/node-protocol.md)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from nodes import client as node_client
from nodes.agent.app import NodeApp
from nodes.agent.auth import CredentialCheck
from nodes.agent.node_state import NodeIdentity
from nodes.credentials import forget_epochs, node_keys, proof_for
from nodes.models import Node

Prover = Callable[[str], str | None]


class ProvingServer:
    """``/health`` and ``/metrics`` on loopback; ``/metrics`` answers ``X-Phalanx-Proof:
    prover(challenge)`` (no header when it gives None)."""

    def __init__(self, prover: Prover) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                body = (
                    json.dumps({"status": "ok"}).encode()
                    if self.path == "/health"
                    else b"phalanx_node_sequences_total 4\n"
                )
                self.send_response(200)
                proof = outer.prover(self.headers.get("X-Phalanx-Challenge") or "")
                if self.path != "/health" and proof is not None:
                    self.send_header("X-Phalanx-Proof", proof)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.prover = prover
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host}:{port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[[Prover], ProvingServer]]:
    servers: list[ProvingServer] = []

    def start(prover: Prover) -> ProvingServer:
        servers.append(ProvingServer(prover))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _node(node_id: str, epoch: str, address: str = "127.0.0.1:9") -> Node:
    forget_epochs()
    return Node.objects.create(node_id=node_id, address=address, credential_epoch=epoch)


@pytest.mark.django_db
def test_it_refuses_a_joined_node_that_cannot_prove_itself(serve) -> None:
    _node("joined", "e1")
    right = node_keys("joined").proof_key
    silent, wrong = serve(lambda c: None), serve(lambda c: proof_for("f" * 64, c))
    honest = serve(lambda c: proof_for(right, c))
    result = node_client.probe(silent.address, node_id="joined", timeout=5)
    assert not result.ok and "sent no X-Phalanx-Proof" in result.error
    result = node_client.probe(wrong.address, node_id="joined", timeout=5)
    assert not result.ok and "wrong X-Phalanx-Proof" in result.error
    assert node_client.probe(honest.address, node_id="joined", timeout=5).ok


@pytest.mark.django_db
def test_it_takes_an_old_style_node_without_a_proof_but_not_with_a_wrong_one(serve) -> None:
    _node("legacy", "")
    assert node_client.probe(serve(lambda c: None).address, node_id="legacy", timeout=5).ok
    wrong = serve(lambda c: proof_for("0" * 64, c))
    assert not node_client.probe(wrong.address, node_id="legacy", timeout=5).ok


@pytest.mark.django_db(transaction=True)
async def test_it_fails_a_chat_over_to_another_node_before_its_first_byte(serve) -> None:
    from asgiref.sync import sync_to_async

    await sync_to_async(_node)("joined", "e1")
    silent = serve(lambda c: None)
    with pytest.raises(node_client.NodeNotProven):
        await node_client.chat_open(
            silent.address,
            node_id="joined",
            payload={"messages": []},
            session_id=None,
            connect_timeout=2,
            read_timeout=5,
        )


async def test_the_node_agent_proves_itself_only_to_its_control_plane() -> None:
    check = CredentialCheck(env_value="phx2.right", proof_key="k" * 64)
    app = NodeApp(NodeIdentity("n1", "p"), None, lambda engine: None, check)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://node") as http:
        called = await http.get(
            "/nope", headers={"Authorization": "Bearer phx2.right", "X-Phalanx-Challenge": "c1"}
        )
        assert called.status_code == 404
        assert called.headers["X-Phalanx-Proof"] == proof_for("k" * 64, "c1")
        stranger = await http.get(
            "/metrics",
            headers={"Authorization": "Bearer phx2.wrong", "X-Phalanx-Challenge": "c1"},
        )
        assert stranger.status_code == 401 and "X-Phalanx-Proof" not in stranger.headers
        unchallenged = await http.get("/nope", headers={"Authorization": "Bearer phx2.right"})
        assert "X-Phalanx-Proof" not in unchallenged.headers
