"""Names that stay true across versions (issue 28): after rolling Q4_1 -> Q4_K_M, clients ask for
the family, old package names still work, and every answer says which version served it.

Real node agents with the bundled model, in the state an upgrade leaves: each node's package
is the Q4_K_M version while the agent still answers to the Q4_1 name it was started with."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import AsyncClient

from console.asgi import application
from inference import lookups
from inference.model_names import client_name, family_of
from inference.models import ModelPackage, RoutingPolicy
from inference.tokens import token_create
from nodes.control import ControlLoop
from nodes.models import Node
from tests.inference.conftest import PACKAGE, address
from tests.support.validation import mark_validated

pytestmark = pytest.mark.django_db(transaction=True)

FAMILY = "smollm2-135m-instruct"
NEW = "smollm2-135m-instruct-q4_k_m"


@sync_to_async
def upgraded(*procs) -> str:
    """Two versions of one family; every node on the newer one, served as the old name."""
    old = ModelPackage.objects.create(
        name=PACKAGE, version="1", family=FAMILY, gguf_path="x", sha256="", quantization="Q4_1"
    )
    new = ModelPackage.objects.create(
        name=NEW, version="1", family=FAMILY, gguf_path="x", sha256="", quantization="Q4_K_M"
    )
    assert old.pk != new.pk
    for proc in procs:
        node_id = proc.log_path.stem
        Node.objects.update_or_create(
            node_id=node_id,
            defaults={"address": address(proc), "package": new, "served_name": PACKAGE},
        )
        mark_validated(node_id, proc.url)
    policy = RoutingPolicy.load()
    policy.request_timeout_s, policy.connect_timeout_s, policy.canary_idle_s = 30.0, 1.0, 0
    policy.save()
    ControlLoop().tick()
    lookups.clear()
    return token_create(name="names")[1]


def chat(model: str, **extra) -> str:
    messages = [{"role": "user", "content": "Say hi."}]
    return json.dumps({"model": model, "messages": messages, "max_tokens": 4, **extra})


def test_it_names_a_node_by_its_family_whatever_the_version_under_it():
    assert client_name(served_name="", package_name=NEW, family=FAMILY) == FAMILY
    assert client_name(served_name=PACKAGE, package_name=NEW, family=FAMILY) == FAMILY
    assert client_name(served_name="", package_name=NEW, family="") == FAMILY
    assert client_name(served_name="agent", package_name=NEW, family=FAMILY) == "agent"
    assert client_name(served_name="", package_name=None, family=None) is None
    assert family_of("gemma-3-270m-q4_k_m") == "gemma-3-270m"


async def test_v1_models_lists_the_family_with_the_versions_serving_it(steady):
    token = await upgraded(*steady)
    response = await AsyncClient().get("/v1/models", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200
    [model] = json.loads(response.content)["data"]
    assert model["id"] == FAMILY
    assert model["up"] == 2
    assert model["versions"] == [{"package": f"{NEW}:1", "up": 2}]


@pytest.mark.parametrize("asked", [FAMILY, NEW, PACKAGE, f"{PACKAGE}:1"])
async def test_any_name_of_the_family_is_answered_by_the_version_serving(steady, asked):
    token = await upgraded(*steady)
    auth = {"Authorization": f"Bearer {token}"}
    response = await AsyncClient().post(
        "/v1/chat/completions", chat(asked), content_type="application/json", headers=auth
    )
    assert response.status_code == 200, response.content
    assert response["X-Phalanx-Package"] == f"{NEW}:1"
    answer = json.loads(response.content)
    assert answer["model"] == FAMILY
    assert answer["system_fingerprint"] == f"{NEW}:1"


async def test_a_streamed_answer_reports_the_version_in_every_chunk(steady):
    token = await upgraded(*steady)
    auth = {"Authorization": f"Bearer {token}", "X-Session-Id": "names-stream"}
    response = await AsyncClient().post(
        "/v1/chat/completions",
        chat(NEW, stream=True),
        content_type="application/json",
        headers=auth,
    )
    assert response.status_code == 200
    assert response["X-Phalanx-Package"] == f"{NEW}:1"
    text = b"".join([c async for c in response.streaming_content]).decode()
    chunks = [
        json.loads(line[6:])
        for line in text.splitlines()
        if line.startswith("data: {") and "error" not in line
    ]
    assert chunks and text.rstrip().endswith("data: [DONE]")
    assert {c["system_fingerprint"] for c in chunks} == {f"{NEW}:1"}
    assert {c["model"] for c in chunks} == {FAMILY}


async def test_the_websocket_done_event_names_the_family_and_the_version(steady):
    token = await upgraded(*steady)
    comm = WebsocketCommunicator(application, f"/ws/sessions/names-ws/?token={token}")
    await comm.connect()
    try:
        await comm.send_json_to(
            {"type": "user", "content": "Say hi.", "model": NEW, "max_tokens": 4}
        )
        while (event := await comm.receive_json_from(timeout=60))["type"] == "delta":
            pass
        assert event["type"] == "done", event
        assert event["model"] == FAMILY
        assert event["package"] == f"{NEW}:1"
    finally:
        await comm.disconnect()


async def test_an_unknown_name_is_still_404(steady):
    token = await upgraded(*steady)
    response = await AsyncClient().post(
        "/v1/chat/completions",
        chat("smollm3-9b"),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 404
    assert json.loads(response.content)["error"]["code"] == "model_not_found"


async def test_a_family_without_a_recorded_family_field_resolves_too(steady):
    await upgraded(*steady)
    await sync_to_async(ModelPackage.objects.update)(family="")
    assert await sync_to_async(lookups.model_for_request)(FAMILY) == FAMILY
