"""The node agent over real HTTP on loopback, with the real bundled model."""

from __future__ import annotations

import json
import sys
import time

import httpx
import pytest

from inference.agent_prefix import agent_fingerprint
from nodes.agent.app import ROUTES
from nodes.agent.auth import ENV_CREDENTIAL, CredentialCheck
from tests.support.processes import spawn, start_node

pytestmark = [pytest.mark.model, pytest.mark.e2e]
PACKAGE = "smollm2-135m-instruct-q4_1"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    proc = start_node(
        "node-t1",
        tmp_path_factory.mktemp("node"),
        threads=2,
        extra_args=["--sequences", "4", "--ctx-per-seq", "1024"],
    )
    yield proc
    proc.stop()


def chat(node, body: dict, **headers) -> httpx.Response:
    return httpx.post(
        f"{node.url}/v1/chat/completions",
        json=body,
        headers={**node.headers, **headers},
        timeout=120,
    )


def stream_events(node, body: dict, **headers) -> list[dict]:
    events = []
    with httpx.stream(
        "POST",
        f"{node.url}/v1/chat/completions",
        json={**body, "stream": True},
        headers={**node.headers, **headers},
        timeout=120,
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


def test_it_reports_health_and_metrics(node) -> None:
    health = httpx.get(f"{node.url}/health").json()
    assert health["status"] == "ok" and health["node"] == "node-t1"
    metrics = httpx.get(f"{node.url}/metrics", headers=node.headers).text
    for name in (
        "phalanx_node_requests_total",
        "phalanx_node_cached_prompt_tokens_total",
        "phalanx_node_kv_used_bytes",
        'phalanx_node_sequences{node="node-t1",state="host"}',
    ):
        assert name in metrics


def test_it_answers_a_chat_in_openai_shape(node) -> None:
    started = time.monotonic()
    r = chat(
        node,
        {
            "model": PACKAGE,
            "messages": [{"role": "user", "content": "Say hello in Spanish."}],
            "temperature": 0,
            "max_tokens": 16,
        },
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-phalanx-node"] == "node-t1"
    body = r.json()
    assert body["object"] == "chat.completion"
    assert "Hola" in body["choices"][0]["message"]["content"]
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    wall_ms = (time.monotonic() - started) * 1000
    assert 0 < body["timings"]["ttft_ms"] <= wall_ms  # the node's own figure, within the call


def test_it_streams_one_event_per_token_with_usage_at_the_end(node) -> None:
    body = {
        "messages": [{"role": "user", "content": "Write a short poem about rain."}],
        "temperature": 0.7,
        "seed": 3,
        "max_tokens": 30,
    }
    events = stream_events(node, body)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    usage = events[-1]["usage"]
    assert (
        usage["completion_tokens"]
        >= len([e for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]) - 1
    )
    assert len(events) > 10
    plain = chat(node, body).json()
    assert plain["choices"][0]["message"]["content"] == text


def test_it_shows_cached_tokens_on_a_sessions_second_turn(node) -> None:
    history = [{"role": "user", "content": "Name a fruit."}]
    first = chat(
        node, {"messages": history, "temperature": 0, "max_tokens": 12}, **{"X-Session-Id": "s-42"}
    ).json()
    history += [first["choices"][0]["message"], {"role": "user", "content": "Another?"}]
    second = chat(
        node, {"messages": history, "temperature": 0, "max_tokens": 12}, **{"X-Session-Id": "s-42"}
    ).json()
    assert (
        second["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"]
    )
    where = httpx.get(f"{node.url}/sessions/s-42", headers=node.headers).json()
    assert where["where"] == "sequence" and where["tokens"] > 0 and where["bytes"] > 0


def test_it_exports_imports_and_erases_a_session(node) -> None:
    # a prompt of its own: no earlier test's sequence shares more than the template's start
    history = [{"role": "user", "content": "Tell me about owls (export test 8431, unique)."}]
    body = {"messages": history, "temperature": 0, "max_tokens": 12}

    def cached(session: str) -> tuple[int, int]:
        usage = chat(node, body, **{"X-Session-Id": session}).json()["usage"]
        return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]

    prompt_tokens, _ = cached("exp-1")
    blob = httpx.get(f"{node.url}/sessions/exp-1/state", headers=node.headers).content
    assert httpx.delete(f"{node.url}/sessions/exp-1", headers=node.headers).json()["erased"] is True
    assert httpx.get(f"{node.url}/sessions/exp-1", headers=node.headers).status_code == 404
    # the control: the same prompt in a session that imported nothing
    _, control = cached("exp-control")
    httpx.delete(f"{node.url}/sessions/exp-control", headers=node.headers)
    imported = httpx.put(f"{node.url}/sessions/exp-2/state", content=blob, headers=node.headers)
    assert imported.status_code == 200 and imported.json()["where"] == "host"
    _, reused = cached("exp-2")
    assert reused >= prompt_tokens - 2  # the imported KV covered the whole prompt
    assert control < prompt_tokens - 2  # which the control did not have
    bad = httpx.put(f"{node.url}/sessions/exp-3/state", content=b"garbage", headers=node.headers)
    assert bad.status_code == 400 and "magic" in bad.json()["error"]["message"]


@pytest.mark.parametrize(
    "body, needle",
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"[1, 2]", "must be a JSON object"),
        (json.dumps({"messages": []}).encode(), "messages must not be empty"),
        (json.dumps({}).encode(), "messages is required"),
        (json.dumps({"messages": "hi"}).encode(), "messages must be a list"),
        (
            json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(),
            "messages[0].content",
        ),
        (
            json.dumps({"messages": [{"role": "robot", "content": "x"}]}).encode(),
            "messages[0].role",
        ),
        (
            json.dumps(
                {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}
            ).encode(),
            "temperature must be a number",
        ),
        (
            json.dumps(
                {"messages": [{"role": "user", "content": "x"}], "max_tokens": 5000}
            ).encode(),
            "per-sequence context",
        ),
        (
            json.dumps({"messages": [{"role": "user", "content": "x " * 2000}]}).encode(),
            "per-sequence context",
        ),
    ],
)
def test_it_rejects_bad_input_with_a_message(node, body: bytes, needle: str) -> None:
    r = httpx.post(
        f"{node.url}/v1/chat/completions", content=body, headers=node.headers, timeout=30
    )
    assert r.status_code == 400
    assert needle in r.json()["error"]["message"]


def test_it_refuses_an_unknown_model(node) -> None:
    r = chat(node, {"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404 and "gpt-9" in r.json()["error"]["message"]


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}


def _assert_weather_call(call: dict) -> None:
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    args = json.loads(call["function"]["arguments"])
    assert isinstance(args["city"], str) and args["unit"] in ("celsius", "fahrenheit")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_it_returns_tool_calls_that_match_the_schema(node, seed: int) -> None:
    body = {
        "messages": [{"role": "user", "content": "What's the weather in Oslo?"}],
        "tools": [WEATHER],
        "tool_choice": "required",
        "temperature": 0.8,
        "seed": seed,
        "max_tokens": 80,
    }
    r = chat(node, body).json()
    assert r["choices"][0]["finish_reason"] == "tool_calls"
    _assert_weather_call(r["choices"][0]["message"]["tool_calls"][0])


def test_it_streams_tool_calls_as_deltas(node) -> None:
    body = {
        "messages": [{"role": "user", "content": "Weather in Lima please"}],
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "temperature": 0,
        "max_tokens": 80,
    }
    events = stream_events(node, body)
    parts = [
        tc
        for e in events
        if e["choices"]
        for tc in e["choices"][0]["delta"].get("tool_calls") or []
    ]
    assert parts[0]["id"].startswith("call_")
    call = {
        "type": "function",
        "function": {
            "name": parts[0]["function"]["name"],
            "arguments": "".join(p["function"]["arguments"] for p in parts),
        },
    }
    _assert_weather_call(call)
    assert [e for e in events if e["choices"]][-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_it_constrains_output_to_a_json_schema(node) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    r = chat(
        node,
        {
            "messages": [{"role": "user", "content": "Invent a person."}],
            "max_tokens": 120,
            "temperature": 0,  # a sampled name can run past max_tokens and cut the JSON
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "p", "schema": schema},
            },
        },
    )
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    data = json.loads(r.json()["choices"][0]["message"]["content"])
    assert isinstance(data["name"], str) and isinstance(data["age"], int)


def test_it_stops_generating_when_the_client_goes_away(node) -> None:
    body = {
        "messages": [{"role": "user", "content": "Count from 1 to 1000, separated by commas."}],
        "max_tokens": 800,
        "temperature": 0,
        "stream": True,
    }
    with httpx.stream(
        "POST", f"{node.url}/v1/chat/completions", json=body, headers=node.headers, timeout=60
    ) as response:
        for _ in zip(range(5), response.iter_lines(), strict=False):
            pass
    deadline = time.monotonic() + 5
    active = None
    while time.monotonic() < deadline:
        active = httpx.get(f"{node.url}/health").json()["sequences_active"]
        if active == 0:
            break
        time.sleep(0.05)
    assert active == 0


def test_it_answers_503_with_retry_after_past_its_queue_bound(tmp_path) -> None:
    small = start_node("node-q", tmp_path, extra_args=["--sequences", "1", "--max-queue", "1"])
    # Greedy counting runs to max_tokens, so the one sequence stays busy for the whole test.
    body = {
        "messages": [{"role": "user", "content": "Count from 1 to 1000, separated by commas."}],
        "max_tokens": 600,
        "temperature": 0,
        "stream": True,
    }

    def health() -> dict:
        return httpx.get(f"{small.url}/health").json()

    def until(predicate) -> None:
        deadline = time.monotonic() + 30
        while not predicate(health()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert predicate(health()), health()

    try:
        url = f"{small.url}/v1/chat/completions"
        with httpx.stream("POST", url, json=body, headers=small.headers, timeout=60):
            until(lambda h: h["sequences_active"] == 1)
            with httpx.stream("POST", url, json=body, headers=small.headers, timeout=60) as queued:
                assert queued.status_code == 200
                until(lambda h: h["queue_depth"] == 1)
                refused = chat(small, {"messages": [{"role": "user", "content": "x"}]})
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        assert "queue is full" in refused.json()["error"]["message"]
    finally:
        small.stop()


def test_it_rejects_an_unpaired_surrogate(node) -> None:
    raw = b'{"messages": [{"role": "user", "content": "\\ud800"}]}'
    r = httpx.post(f"{node.url}/v1/chat/completions", content=raw, headers=node.headers, timeout=30)
    assert r.status_code == 400 and "surrogate" in r.json()["error"]["message"]


def test_it_answers_only_its_control_plane(node) -> None:
    wrong = {"Authorization": "Bearer phx1.not-the-credential"}
    for route in ROUTES:
        for method in route.methods:
            url = f"{node.url}{route.example}"
            bare = httpx.request(method, url, timeout=30)
            guessed = httpx.request(method, url, headers=wrong, timeout=30)
            if route.public:
                assert bare.status_code == 200, (method, route.example)
                continue
            for response in (bare, guessed):
                assert response.status_code == 401, (method, route.example)
                assert response.headers["www-authenticate"] == "Bearer"
                assert "control plane" in response.json()["error"]["message"]
            allowed = httpx.request(method, url, headers=node.headers, timeout=30)
            assert allowed.status_code != 401, (method, route.example)
    assert httpx.get(f"{node.url}/no/such/path").status_code == 401


def test_it_will_not_start_without_a_credential(tmp_path) -> None:
    proc = spawn(
        [sys.executable, "manage.py", "runnode", "--id", "node-x", "--model", __file__],
        tmp_path / "node-x.log",
        env={ENV_CREDENTIAL: ""},
    )
    assert proc.popen.wait(timeout=60) != 0
    assert "no node credential" in proc.log()


def test_it_rereads_its_credential_file_for_a_rotation(tmp_path) -> None:
    file = tmp_path / "credentials"
    file.write_text("phx1.old  # until the control plane has the new secret\n")
    check = CredentialCheck(file=file)
    assert check.accepts("Bearer phx1.old") and not check.accepts("Bearer phx1.new")
    file.write_text("phx1.old\nphx1.new\n")
    assert check.accepts("Bearer phx1.old") and check.accepts("Bearer phx1.new")
    file.write_text("phx1.new\n")
    assert not check.accepts("Bearer phx1.old") and check.accepts("bearer phx1.new")
    assert not check.accepts(None) and not check.accepts("phx1.new")


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"type": "string", "maxLength": 30000}, "maxLength must be at most 256"),  # crashed it
        ({"type": "string", "pattern": "^((((a{0,8}){0,8}){0,8}){0,8})$"}, "repeated group"),
        ({"enum": []}, "enum must be a non-empty list"),
        ({"const": 'a"\\]['}, "rejected the grammar"),  # found by llama.cpp itself
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_a_schema_the_node_cannot_take_is_the_requests_fault(node, schema, says, stream) -> None:
    body = {
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 3,
        "stream": stream,
        "response_format": schema_format(schema),
    }
    if stream and "rejected" in says:  # found on the engine thread, after the stream began
        events = stream_events(node, body)
        assert events[-1]["error"]["type"] == "invalid_request_error"
        assert says in events[-1]["error"]["message"]
    else:
        r = chat(node, body)
        assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
        assert r.json()["error"]["code"] == "unsupported_schema"
    assert httpx.get(f"{node.url}/health").json()["status"] == "ok"


@pytest.mark.parametrize("arguments", ["1" * 5000, "[" * 100000, "not json"])
def test_a_tool_call_in_the_history_is_rendered_whatever_its_arguments(node, arguments) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    messages = [
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ]
    r = chat(node, {"messages": messages, "max_tokens": 2})
    assert r.status_code in (200, 400), r.text  # 400 only when it is over the context
    assert r.status_code == 200 or r.json()["error"]["code"] == "context_length_exceeded"


def test_a_prompt_that_cannot_fit_is_refused_before_it_is_tokenized(node) -> None:
    messages = [{"role": "user", "content": "a"}] * 50_000
    r = chat(node, {"messages": messages, "max_tokens": 2})
    assert r.status_code == 400 and "bytes cannot fit" in r.json()["error"]["message"]


def test_every_log_line_of_a_chat_names_its_request_session_node_and_package(node) -> None:
    body = {"model": PACKAGE, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    assert chat(node, body, **{"X-Request-Id": "req-log-1", "X-Session-Id": "s-log"}).is_success
    lines = [line for line in node.log().splitlines() if "request_id=req-log-1" in line]
    assert lines and "chat answered" in lines[-1]
    for field in ("session_id=s-log", "node_id=node-t1", f"package={PACKAGE}", "ttft_ms="):
        assert field in lines[-1], lines[-1]
    refused = chat(node, body, **{"X-Request-Id": "no spaces allowed"})
    assert refused.status_code == 400 and "X-Request-Id must be" in refused.text


def test_it_publishes_the_agents_it_served(node) -> None:
    system = {"role": "system", "content": "You are the agent that publishes its prefix."}
    body = {"messages": [system, {"role": "user", "content": "Hi"}], "max_tokens": 2}
    assert chat(node, body).status_code == 200
    metrics = httpx.get(f"{node.url}/metrics", headers=node.headers).text
    agent = agent_fingerprint([system])
    assert f'phalanx_node_agent_prefix{{node="node-t1",agent="{agent}"}} 1' in metrics
