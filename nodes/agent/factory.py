"""Wiring: a ready engine -> the chat service that formats prompts with its model's template."""

from __future__ import annotations

from inference.engine.prompt import ChatFormatter
from inference.engine.scheduler import Engine
from nodes.agent.completions import ChatService


def chat_service_for(engine: Engine) -> ChatService:
    model = engine.model
    assert model is not None, "engine is not loaded"
    formatter = ChatFormatter(
        model.meta("tokenizer.chat_template"),
        bos_token=model.bos_token,
        eos_token=model.eos_token,
        special_texts=model.control_token_texts(),
    )
    return ChatService(engine, formatter, max_token_bytes=model.max_token_bytes())
