"""Cached answers through ``/v1/chat/completions`` with a real node and the bundled model:
a stateless request that opts in is answered from the cache when an earlier one said the same
thing, marked as a hit, bypassable, never for a near-miss, and forgotten on a package change."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from inference.models import ApiToken, ModelPackage, Upgrade
from inference.semcache import service
from inference.upgrades.outcomes import finish
from tests.inference.conftest import NODE_ARGS, PACKAGE, inventory
from tests.support.processes import start_node

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    proc = start_node("cache-1", tmp_path_factory.mktemp("cache-node"), extra_args=NODE_ARGS)
    yield proc
    proc.stop()


@pytest.fixture
def array(node, settings, tmp_path):
    settings.VAR_DIR = tmp_path  # a cache of its own
    settings.REDIS_URL = None
    return node


@pytest.fixture
async def token(array) -> str:
    return await inventory(array)


def body(question: str, **extra) -> str:
    messages = [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": question},
    ]
    return json.dumps(
        {"model": PACKAGE, "messages": messages, "max_tokens": 12, "temperature": 0, **extra}
    )


async def ask(token: str, question: str, cache: str | None = "use", **extra):
    headers = {"Authorization": f"Bearer {token}"}
    if cache:
        headers["X-Phalanx-Cache"] = cache
    response = await AsyncClient().post(
        "/v1/chat/completions",
        body(question, **extra),
        content_type="application/json",
        headers=headers,
    )
    if response.streaming:
        response.body_text = b"".join([c async for c in response.streaming_content]).decode()
    else:
        response.body_text = response.content.decode()
    return response


async def stored(count: int = 1) -> None:
    """Wait for the answer the proxy stores after its response went out."""
    for _ in range(100):
        # the_cache() may read the database (its encoder is cached 2 s): in the thread too
        sizes = await sync_to_async(lambda: service.the_cache().store.sizes())()
        if sum(sizes.values()) >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the answer was never stored")


def content(response) -> str:
    return json.loads(response.body_text)["choices"][0]["message"]["content"]


def streamed_content(response) -> str:
    events = [line[6:] for line in response.body_text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    ends = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert ends[-1] in ("stop", "length", "tool_calls")
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


async def test_a_paraphrase_is_answered_from_the_cache_and_says_so(token):
    first = await ask(token, "What is the capital of France?", max_tokens=64)
    assert first.status_code == 200 and first["X-Phalanx-Cache"] == "miss"
    assert first["X-Phalanx-Node"] == "cache-1"
    await stored()
    again = await ask(token, "Tell me the capital of France.", max_tokens=64)
    assert again.status_code == 200 and again["X-Phalanx-Cache"] == "hit"
    assert 0.75 <= float(again["X-Phalanx-Cache-Similarity"]) < 1.0
    assert float(again["X-Phalanx-Cache-Age"]) >= 0 and again["X-Phalanx-Cache-Id"].isdigit()
    assert "X-Phalanx-Node" not in again  # no node was asked
    assert content(again) == content(first)
    assert json.loads(again.body_text)["id"] != json.loads(first.body_text)["id"]


async def test_a_streamed_answer_is_stored_and_replayed_as_a_stream(token):
    first = await ask(token, "Name a primary colour.", stream=True, max_tokens=64)
    assert first["X-Phalanx-Cache"] == "miss"
    said = streamed_content(first)
    await stored()
    again = await ask(token, "Name a primary colour.", stream=True, max_tokens=64)
    assert again["X-Phalanx-Cache"] == "hit" and again["X-Phalanx-Cache-Similarity"] == "1.0000"
    assert streamed_content(again) == said and said
    whole = await ask(token, "Name a primary colour.", max_tokens=64)
    assert whole["X-Phalanx-Cache"] == "hit" and content(whole) == said


async def test_a_hit_can_be_bypassed(token):
    await ask(token, "What is two plus two?", max_tokens=64)
    await stored()
    bypassed = await ask(token, "What is two plus two?", cache="bypass", max_tokens=64)
    assert bypassed["X-Phalanx-Cache"] == "bypass" and bypassed["X-Phalanx-Node"] == "cache-1"


async def test_a_near_miss_goes_to_the_model(token):
    await ask(token, "Turn on the kitchen lights.", max_tokens=64)
    await stored()
    reversed_ = await ask(token, "Turn off the kitchen lights.", max_tokens=64)
    assert reversed_["X-Phalanx-Cache"] == "miss" and reversed_["X-Phalanx-Node"] == "cache-1"


async def test_what_cannot_be_cached_says_why(token):
    warm = await ask(token, "Say hello.", temperature=0.9)
    assert warm["X-Phalanx-Cache"] == "skip"
    assert warm["X-Phalanx-Cache-Reason"] == "temperature 0.9 is above 0.5"
    later = json.loads(body("Say hello."))
    later["messages"] += [
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Again."},
    ]
    response = await AsyncClient().post(
        "/v1/chat/completions",
        json.dumps(later),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}", "X-Phalanx-Cache": "use"},
    )
    assert response["X-Phalanx-Cache"] == "skip"
    assert response["X-Phalanx-Cache-Reason"].startswith("not stateless")
    silent = await ask(token, "Say hello.", cache=None)
    assert "X-Phalanx-Cache" not in silent  # neither the request nor its token opted in


async def test_a_token_opts_its_requests_in(token):
    await ApiToken.objects.filter(name="faults").aupdate(cache_answers=True)
    first = await ask(token, "What colour is the sky?", cache=None, max_tokens=64)
    assert first["X-Phalanx-Cache"] == "miss"
    await stored()
    again = await ask(token, "What colour is the sky?", cache=None, max_tokens=64)
    assert again["X-Phalanx-Cache"] == "hit"


async def test_a_bad_cache_header_is_refused_naming_it(token):
    response = await ask(token, "Hi.", cache="sometimes")
    assert response.status_code == 400
    assert "X-Phalanx-Cache must be 'use' or 'bypass'" in response.body_text


async def test_an_upgrade_of_the_model_forgets_its_answers(token):
    await ask(token, "What is the largest ocean?")
    await stored()
    assert (await ask(token, "What is the largest ocean?"))["X-Phalanx-Cache"] == "hit"

    @sync_to_async
    def upgrade_ends() -> None:
        old = ModelPackage.objects.get(name=PACKAGE)
        upgrade = Upgrade.objects.create(
            model=PACKAGE, from_package=old, to_package=old, nodes=[], state=Upgrade.State.RUNNING
        )
        finish(upgrade, Upgrade.State.SUCCEEDED, "every node on the new version")

    await upgrade_ends()
    after = await ask(token, "What is the largest ocean?")
    assert after["X-Phalanx-Cache"] == "miss" and after["X-Phalanx-Node"] == "cache-1"


async def test_content_parts_are_read_as_the_node_reads_them(token):
    parts = [{"type": "text", "text": "What is 1"}, {"type": "text", "text": "0 plus 5?"}]
    await ask_messages(token, [{"role": "user", "content": parts}])
    await stored()
    spaced = await ask_messages(token, [{"role": "user", "content": "What is 1 0 plus 5?"}])
    assert spaced["X-Phalanx-Cache"] == "miss"  # the node read "10", not "1 0"


async def test_where_the_system_message_stands_is_part_of_the_question(token):
    system = {"role": "system", "content": "Answer in German."}
    user = {"role": "user", "content": "What is the capital of France?"}
    await ask_messages(token, [system, user])
    await stored()
    assert (await ask_messages(token, [user, system]))["X-Phalanx-Cache"] == "miss"
    assert (await ask_messages(token, [system, user]))["X-Phalanx-Cache"] == "hit"


async def ask_messages(token: str, messages: list):
    body = {"model": PACKAGE, "messages": messages, "max_tokens": 8, "temperature": 0}
    return await AsyncClient().post(
        "/v1/chat/completions",
        json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}", "X-Phalanx-Cache": "use"},
    )
