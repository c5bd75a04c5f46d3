"""A node switches package in place (PUT /package): a stream running on the old engine ends
normally, the next request gets the new package, a bad request or a file that is not what the
control plane says leaves the old one serving. Real model, real process, loopback HTTP."""

from __future__ import annotations

import hashlib
import json
import threading
import time

import httpx
import pytest

from inference.packages.gguf_files import write_with_chat_template
from tests.support.processes import bundled_model_path, start_node

pytestmark = [pytest.mark.model, pytest.mark.e2e]
OLD = "smollm2-135m-instruct-q4_1"
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    proc = start_node("node-sw", tmp_path_factory.mktemp("node"), threads=2)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def other_gguf(tmp_path_factory):
    """Another file (the bundled model with another chat template) and its sha256."""
    path = tmp_path_factory.mktemp("gguf") / "other.gguf"
    write_with_chat_template(bundled_model_path(), path, CHATML)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def put(node, body) -> httpx.Response:
    return httpx.put(f"{node.url}/package", json=body, headers=node.headers, timeout=30)


def until_switch_ends(node, timeout: float = 180.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = httpx.get(f"{node.url}/package", headers=node.headers, timeout=10).json()
        if state["switch"] and state["switch"]["state"] in ("done", "failed"):
            return state
        time.sleep(0.3)
    raise AssertionError("the switch did not end")


def test_bad_switch_requests_are_refused_naming_the_field(node) -> None:
    refused = put(node, {"package": "x"})
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == "model_path: the GGUF's path on this node's host"
    missing = put(node, {"model_path": "/nowhere.gguf", "package": "x"})
    assert missing.json()["error"]["message"] == "model_path: no file at /nowhere.gguf on this node"
    settings = put(
        node, {"model_path": str(bundled_model_path()), "package": "x", "settings": {"threads": 0}}
    )
    assert settings.json()["error"]["message"] == "settings.threads: a whole number from 1 to 256"
    assert httpx.put(f"{node.url}/package", json={}).status_code == 401  # only its control plane


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"threads": 257}, "settings.threads: a whole number from 1 to 256"),
        ({"sequences": 100_000}, "settings.sequences: a whole number from 1 to 256"),
        ({"ctx_per_seq": 255}, "settings.ctx_per_seq: a whole number from 256 to 131072"),
        ({"ctx_per_seq": 10**7}, "settings.ctx_per_seq: a whole number from 256 to 131072"),
        ({"host_ram_mib": 2**21}, "settings.host_ram_mib: a whole number from 1 to 1048576"),
    ],
)
def test_a_setting_out_of_its_bounds_is_refused_as_the_control_plane_would(
    node, settings, message
) -> None:
    """A direct ``PUT /package`` (not through an upgrade) is capped by the same bounds as an
    upgrade's node settings (``nodes.agent.engine_settings.LIMITS``), and the old engine goes
    on serving."""
    body = {"model_path": str(bundled_model_path()), "package": "x", "settings": settings}
    refused = put(node, body)
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == message
    assert httpx.get(f"{node.url}/package", headers=node.headers).json()["package"] == OLD


def test_a_file_that_is_not_what_was_announced_is_not_loaded(node, other_gguf) -> None:
    path, _ = other_gguf
    accepted = put(node, {"model_path": str(path), "package": "other", "sha256": "0" * 64})
    assert accepted.status_code == 202
    state = until_switch_ends(node)
    assert state["switch"]["state"] == "failed" and "not 0000" in state["switch"]["error"]
    assert state["package"] == OLD  # still serving the old one
    health = httpx.get(f"{node.url}/health").json()
    assert health["model"] == OLD and health["switch"]["state"] == "failed"


def start_long_stream(
    node,
) -> tuple[threading.Thread, list[dict], list[float], threading.Event]:
    """A long stream on the old package, read on a thread of its own: the thread, the events it
    has read, when it read ``[DONE]`` and whether it has; returns once three events are in (or
    after 60 s)."""
    events: list[dict] = []
    ended: list[float] = []
    done = threading.Event()

    def stream() -> None:
        body = {
            "model": OLD,
            "stream": True,
            "max_tokens": 800,
            "temperature": 0,
            "messages": [{"role": "user", "content": "Repeat the word hello a thousand times."}],
        }
        with httpx.stream(
            "POST", f"{node.url}/v1/chat/completions", json=body, headers=node.headers, timeout=300
        ) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    events.append(json.loads(line[6:]))
                elif line == "data: [DONE]":
                    ended.append(time.time())
                    done.set()

    reader = threading.Thread(target=stream)
    reader.start()
    deadline = time.monotonic() + 60
    while len(events) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    return reader, events, ended, done


def test_a_stream_started_before_the_switch_ends_on_the_old_package(node, other_gguf) -> None:
    path, sha = other_gguf
    reader, events, ended, done = start_long_stream(node)
    accepted = put(node, {"model_path": str(path), "package": "smol-chatml", "sha256": sha})
    assert accepted.status_code == 202
    assert put(node, {"model_path": str(path), "package": "again"}).status_code == 409
    state = until_switch_ends(node)
    reader.join(timeout=300)
    assert done.is_set() and state["switch"]["state"] == "done"
    assert ended[0] > state["switch"]["finished_at"]  # it was still streaming at the swap
    assert all(e["model"] == OLD for e in events)
    finishes = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    assert finishes in (["length"], ["stop"])  # it ended normally, once
    assert "usage" in events[-1]
    assert state["package"] == "smol-chatml" and state["sha256"] == sha
    assert httpx.get(f"{node.url}/health").json()["sha256"] == sha
    new = httpx.post(
        f"{node.url}/v1/chat/completions",
        json={
            "model": "smol-chatml",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "Hi"}],
        },
        headers=node.headers,
        timeout=120,
    )
    assert new.status_code == 200 and new.json()["model"] == "smol-chatml"
    old = httpx.post(
        f"{node.url}/v1/chat/completions",
        json={"model": OLD, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]},
        headers=node.headers,
        timeout=120,
    )
    assert old.status_code == 404
