"""A validated request's sampling settings, as the node hands them to the engine (pure)."""

from __future__ import annotations

from inference.chat_request import parse_chat_request
from nodes.agent.completions import needs_bos, sampling_params

MESSAGES = [{"role": "user", "content": "hi"}]


def test_every_sampling_field_reaches_the_engine() -> None:
    chat = parse_chat_request(
        {
            "model": "m",
            "messages": MESSAGES,
            "temperature": 0.3,
            "top_p": 0.5,
            "top_k": 7,
            "min_p": 0.2,
            "repeat_penalty": 1.3,
            "frequency_penalty": 0.4,
            "presence_penalty": -0.6,
            "seed": 11,
            "stop": ["END", "##"],
        }
    )
    params = sampling_params(chat, max_tokens=33)
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k) == (33, 0.3, 0.5, 7)
    assert (params.min_p, params.repeat_penalty) == (0.2, 1.3)
    assert (params.frequency_penalty, params.presence_penalty) == (0.4, -0.6)
    assert params.seed == 11 and params.stop == ("END", "##") and params.grammar is None


def test_the_defaults_are_llama_servers_and_the_seed_is_random() -> None:
    chat = parse_chat_request({"model": "m", "messages": MESSAGES})
    first, second = sampling_params(chat, 16), sampling_params(chat, 16)
    assert (first.temperature, first.top_p, first.top_k, first.min_p) == (0.8, 0.95, 40, 0.05)
    assert (first.repeat_penalty, first.frequency_penalty, first.presence_penalty) == (1, 0, 0)
    assert first.stop == () and first.grammar is None
    assert first.seed != second.seed  # 1 in 2**31 to collide


def test_tools_and_json_formats_become_a_grammar() -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    chat = parse_chat_request({"model": "m", "messages": MESSAGES, "tools": [tool]})
    assert "get_weather" in sampling_params(chat, 8).grammar
    fmt = {"type": "json_object"}
    chat = parse_chat_request({"model": "m", "messages": MESSAGES, "response_format": fmt})
    assert "root" in sampling_params(chat, 8).grammar


# --- the BOS is added once, whether or not the chat template writes it -----------------


def test_a_template_that_writes_the_bos_gets_no_second_one():
    assert needs_bos("<bos><start_of_turn>user\nhi", bos_token="<bos>", add_bos=True) is False
    assert needs_bos("<start_of_turn>user\nhi", bos_token="<bos>", add_bos=True) is True


def test_a_model_without_a_bos_gets_none():
    assert needs_bos("<|im_start|>user\nhi", bos_token="<|im_start|>", add_bos=False) is False
    assert needs_bos("hi", bos_token="", add_bos=True) is True
