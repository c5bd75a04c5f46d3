"""External nodes (issue 30, the hybrid array): llama-cpp-python's own OpenAI-compatible server
(``python -m llama_cpp.server``, the bundled model) registered as a node of kind ``external``
beside our own nodes: the control loop finds it healthy through ``/v1/models`` (it has no
``/health``), its device validation is waived as such, it serves a model only it has and a
pinned session, and a session pinned to it fails over to another node when it dies."""

from __future__ import annotations

import json
import sys

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from console.models import AuditEntry
from inference.models import SessionRoute
from nodes import services as node_services
from nodes.control import ControlLoop
from nodes.credentials import node_credential
from nodes.models import Node
from tests.inference.conftest import MODEL
from tests.support.processes import Proc, bundled_model_path, free_port, spawn

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.model, pytest.mark.e2e]

EXTERNAL = "ext-1"


@pytest.fixture(scope="module")
def llama_cpp_server(tmp_path_factory):
    """llama-cpp-python's server on a free loopback port, its API key this array's credential
    for ``ext-1`` (what the control plane presents to that node)."""
    port = free_port()
    args = [sys.executable, "-m", "llama_cpp.server", "--model", str(bundled_model_path())]
    args += ["--host", "127.0.0.1", "--port", str(port), "--n_ctx", "1024", "--n_threads", "1"]
    log = tmp_path_factory.mktemp("external") / "llama_cpp_server.log"
    proc = spawn([*args, "--api_key", node_credential(EXTERNAL)], log)
    proc.url = f"http://127.0.0.1:{port}"
    _wait_models(proc)
    yield proc
    proc.stop()


def _wait_models(proc: Proc, timeout: float = 120.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    headers = {"Authorization": f"Bearer {node_credential(EXTERNAL)}"}
    while time.monotonic() < deadline:
        assert proc.popen.poll() is None, proc.log()[-3000:]
        try:
            if httpx.get(f"{proc.url}/v1/models", headers=headers, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"llama_cpp.server did not start:\n{proc.log()[-3000:]}")


@sync_to_async
def register_external(server: Proc, served_name: str) -> Node:
    from inference.models import RoutingPolicy

    policy = RoutingPolicy.load()
    policy.request_timeout_s = 120.0  # a real model on a busy machine: no first-byte race here
    policy.save()
    node, _ = node_services.node_upsert(
        node_id=EXTERNAL,
        kind=Node.Kind.EXTERNAL,
        served_name=served_name,
        address=server.url.removeprefix("http://"),
        package_id=None,
    )
    ControlLoop().tick()  # the control loop's probe: /health 404, then /v1/models
    return Node.objects.get(pk=node.pk)


async def turn(session: str, model: str, text: str, auth: dict) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 8}
    return await AsyncClient().post(
        "/v1/chat/completions",
        json.dumps(body),
        content_type="application/json",
        headers={**auth, "X-Session-Id": session},
    )


async def test_an_external_server_serves_a_model_only_it_has_to_a_pinned_session(
    llama_cpp_server, fakes, auth
):
    node = await register_external(llama_cpp_server, "ext-smol")
    assert node.state == Node.State.UP and node.validation == Node.Validation.WAIVED
    assert "external OpenAI-compatible server" in node.validation_reason
    waiver = await sync_to_async(waiver_entry)(EXTERNAL)
    assert waiver.changes[0] == "validation: pending \u2192 waived"
    for text in ("Name a colour.", "And another one."):
        answer = await turn("ext-session", "ext-smol", text, auth)
        assert answer.status_code == 200, answer.content
        assert answer.headers["X-Phalanx-Node"] == EXTERNAL
        assert json.loads(answer.content)["choices"][0]["message"]["content"].strip()
    route = await sync_to_async(SessionRoute.objects.select_related("node").get)(
        session_id="ext-session"
    )
    assert route.node.node_id == EXTERNAL and route.turns == 2
    assert [f.requests for f in fakes.values()] == [[], []]  # our nodes serve another model


async def test_a_session_pinned_to_an_external_server_fails_over_when_it_dies(
    llama_cpp_server, fakes, auth
):
    await sync_to_async(Node.objects.filter(node_id__in=list(fakes)).update)(state="draining")
    await register_external(llama_cpp_server, MODEL)  # the same model as our nodes
    first = await turn("failover", MODEL, "Say hi.", auth)
    assert first.status_code == 200 and first.headers["X-Phalanx-Node"] == EXTERNAL
    await sync_to_async(Node.objects.filter(node_id__in=list(fakes)).update)(state="up")
    llama_cpp_server.stop()  # the GPU box goes away
    second = await turn("failover", MODEL, "Say hi again.", auth)
    assert second.status_code == 200, second.content
    assert second.headers["X-Phalanx-Node"] in fakes
    route = await sync_to_async(SessionRoute.objects.select_related("node").get)(
        session_id="failover"
    )
    assert route.node.node_id == second.headers["X-Phalanx-Node"] and route.moves == 1


def waiver_entry(node_id: str) -> AuditEntry:
    return AuditEntry.objects.get(action="node.waive_validation", target=node_id)
