"""The load generator's parts that need no server: tool-call checks against the schema, error
kinds, folding streamed chunks, and the history a session sends."""

from __future__ import annotations

import httpx
import openai
from openai.types.chat import ChatCompletionChunk

from inference.loadtests.turns import (
    Reply,
    _take_chunk,
    _tool_message,
    error_kind,
    tool_call_valid,
)


def call(name: str, arguments: str) -> dict:
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}


def test_it_checks_a_tool_call_against_its_schema():
    assert tool_call_valid(call("get_order_status", '{"order_id": "A-1"}'))
    assert not tool_call_valid(call("get_order_status", "{}"))  # required argument missing
    assert not tool_call_valid(call("create_ticket", '{"title": "x", "priority": "urgent"}'))
    assert not tool_call_valid(call("search_products", '{"query": "x", "max_results": 50}'))
    assert not tool_call_valid(call("launch_rocket", "{}"))
    assert not tool_call_valid(call("get_order_status", '{"order_id": '))  # not JSON
    deep = '{"order_id": "A-1", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    assert not tool_call_valid(call("get_order_status", deep))  # past the parser's depth


def test_it_names_error_kinds_as_a_client_sees_them():
    request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
    full = httpx.Response(
        429, request=request, json={"error": {"message": "full", "code": "array_full"}}
    )
    kind, message = error_kind(
        openai.RateLimitError("full", response=full, body={"message": "full", "code": "array_full"})
    )
    assert kind == "http_429 array_full" and message == "full"
    assert error_kind(openai.APITimeoutError(request=request))[0] == "timeout"
    assert error_kind(openai.APIConnectionError(request=request))[0] == "connection"


def chunk(delta: dict | None = None, finish: str | None = None, **extra) -> ChatCompletionChunk:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return ChatCompletionChunk.model_validate(
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": choices,
            **extra,
        }
    )


def test_it_folds_a_streamed_tool_call_and_the_nodes_timings():
    reply = Reply()
    assert not _take_chunk(reply, chunk({"role": "assistant"}))
    assert _take_chunk(
        reply,
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_9",
                        "type": "function",
                        "function": {"name": "create_ticket", "arguments": ""},
                    }
                ]
            }
        ),
    )
    _take_chunk(
        reply, chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"title": "t", '}}]})
    )
    _take_chunk(
        reply,
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"priority": "low"}'}}]}),
    )
    _take_chunk(reply, chunk({}, finish="tool_calls"))
    _take_chunk(
        reply,
        chunk(
            None,
            usage={"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13},
            timings={"queue_ms": 1.5, "prefill_ms": 20.0},
        ),
    )
    assert reply.finish == "tool_calls" and reply.timings["prefill_ms"] == 20.0
    assert reply.usage.prompt_tokens == 9
    message = reply.assistant_message()
    assert message["content"] is None
    assert tool_call_valid(message["tool_calls"][0])
    result = _tool_message(message["tool_calls"][0])
    assert result["role"] == "tool" and result["tool_call_id"] == "call_9"
    assert '"state": "open"' in result["content"]


def test_it_keeps_text_answers_as_the_next_assistant_message():
    reply = Reply()
    assert _take_chunk(reply, chunk({"content": "Hel"}))
    _take_chunk(reply, chunk({"content": "lo"}, finish="stop"))
    assert reply.assistant_message() == {"role": "assistant", "content": "Hello"}
