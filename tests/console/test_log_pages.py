"""The Logs page and its live tail (``/ws/logs/``): filters as the API's, records a person can
read, links from a node's and a session's page."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from console.asgi import application
from console.lib.log_store import records_store
from console.models import Role
from inference import tokens


def store(*records: dict, node_id: str = "") -> None:
    records_store([json.dumps({"level": "info", **r}) for r in records], node_id=node_id)


@pytest.mark.django_db
def test_the_page_shows_the_records_a_filter_asks_for(login) -> None:
    store({"event": "answer closed", "process": "serve", "request_id": "req-a", "status": 200})
    store({"event": "chat answered", "process": "runnode", "request_id": "req-a"}, node_id="n-1")
    store({"event": "other turn", "process": "serve", "request_id": "req-b"})
    page = login("viewer").get("/logs/?request_id=req-a").content.decode()
    assert "answer closed" in page and "chat answered" in page and "other turn" not in page
    assert "status=200" in page and 'href="?node_id=n-1"' in page
    assert "request_id=req-a&amp;format=jsonl" in page


@pytest.mark.django_db
def test_a_filter_that_cannot_be_asked_is_said_on_the_page(login) -> None:
    response = login("viewer").get("/logs/?since=last+tuesday")
    assert response.status_code == 422
    assert "since: &#x27;last tuesday&#x27; is not an ISO 8601 time" in response.content.decode()


@pytest.mark.django_db
def test_a_node_page_links_to_its_lines(login, node) -> None:
    page = login("viewer").get("/nodes/node-01/").content.decode()
    assert 'href="/logs/?node_id=node-01"' in page


@pytest.mark.django_db(transaction=True)
async def test_the_live_tail_sends_new_matching_records() -> None:
    token = await sync_to_async(tokens.token_issue)(name="tail", role=Role.VIEWER)
    await sync_to_async(store)({"event": "before", "process": "serve", "session_id": "s-1"})
    path = f"/ws/logs/?token={token[1]}&session_id=s-1&after=0"
    communicator = WebsocketCommunicator(application, path)
    assert (await communicator.connect())[0]
    first = await communicator.receive_json_from(timeout=5)
    assert [r["event"] for r in first["records"]] == ["before"]
    await sync_to_async(store)(
        {"event": "other session", "process": "serve", "session_id": "s-2"},
        {"event": "new turn", "process": "runnode", "session_id": "s-1"},
    )
    second = await communicator.receive_json_from(timeout=5)
    assert [r["event"] for r in second["records"]] == ["new turn"]
    await communicator.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_the_live_tail_names_a_bad_filter() -> None:
    token = await sync_to_async(tokens.token_issue)(name="tail", role=Role.VIEWER)
    communicator = WebsocketCommunicator(application, f"/ws/logs/?token={token[1]}&level=loud")
    await communicator.connect()
    error = await communicator.receive_json_from(timeout=5)
    assert error["type"] == "error" and error["message"].startswith("level: must be one of")
    assert (await communicator.receive_output(timeout=5))["code"] == 4422
