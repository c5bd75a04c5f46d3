"""Chat completions on a node: prompt building, engine submission and OpenAI-shaped output.

``ChatService.start`` turns a validated ``ChatRequest`` into an engine ``Request`` whose events
arrive on an asyncio queue; ``CompletionShaper`` turns those events into OpenAI chunks (with
tool calls buffered and emitted as ``tool_calls`` deltas) or one ``chat.completion`` object.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from inference.chat_request import ChatRequest
from inference.engine.prompt import (
    TOOL_OPEN,
    ChatFormatter,
    NoChatTemplate,
    TemplateError,
    check_grammar,
    parse_tool_call,
    response_format_grammar,
    tool_grammar,
)
from inference.engine.request import (
    EngineEvent,
    Failed,
    Finished,
    PromptTooLong,
    Request,
    TextDelta,
)
from inference.engine.sampling import SamplingParams
from inference.engine.scheduler import Engine
from inference.errors import BadRequest

DEFAULT_MAX_TOKENS = 1024


def needs_bos(text: str, *, bos_token: str, add_bos: bool) -> bool:
    """Whether tokenizing the rendered prompt must add the model's BOS: when the model wants
    one (``add_bos``) and the template has not written it already (many do, ``{{ bos_token
    }}``: Gemma, Llama 3). Two BOS tokens make a model answer worse; llama.cpp's server also
    adds it once."""
    return add_bos and not (bos_token and text.startswith(bos_token))


@dataclass
class Generation:
    """A submitted request and the queue its events arrive on."""

    request: Request
    events: asyncio.Queue[EngineEvent]
    chat: ChatRequest


class ChatService:
    """Builds prompts with the model's template and submits them to the engine."""

    def __init__(
        self, engine: Engine, formatter: ChatFormatter, *, max_token_bytes: int = 256
    ) -> None:
        self.engine = engine
        self.formatter = formatter
        self.max_token_bytes = max_token_bytes

    def rendered(self, chat: ChatRequest) -> str:
        """``chat``'s prompt text by the model's template; ``BadRequest`` when it cannot be."""
        try:
            return self.formatter.render(
                chat.messages, chat.tool_mode, continue_final=chat.continue_final
            )
        except NoChatTemplate as exc:
            raise BadRequest(str(exc), param="model", code="no_chat_template") from exc
        except TemplateError as exc:
            raise BadRequest(str(exc), param="messages", code="template_error") from exc

    def tokenized(self, text: str) -> list[int]:
        """``text``'s tokens, with the model's BOS unless the template wrote it."""
        model = self.engine.model
        assert model is not None
        add_bos = needs_bos(text, bos_token=model.bos_token, add_bos=model.add_bos)
        return model.tokenize(text, add_special=add_bos)

    def start(
        self,
        chat: ChatRequest,
        *,
        session_id: str | None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Generation:
        """Submit ``chat``; its events arrive on ``loop`` (default: the running one). Safe to
        call from a worker thread with ``loop`` given (rendering and tokenizing a long prompt
        take a while). Raises ``BadRequest`` (template, context overflow) or ``QueueFull``."""
        text = self.rendered(chat)
        size = len(text.encode("utf-8", "replace"))
        if size > self.engine.config.ctx_per_seq * self.max_token_bytes:
            raise BadRequest(
                f"prompt of {size:,} bytes cannot fit the per-sequence context of "
                f"{self.engine.config.ctx_per_seq} tokens",
                param="messages",
                code="context_length_exceeded",
            )
        prompt = self.tokenized(text)
        room = self.engine.config.ctx_per_seq - len(prompt)
        if room < 1:
            raise BadRequest(
                f"prompt of {len(prompt)} tokens does not fit the per-sequence context of "
                f"{self.engine.config.ctx_per_seq} tokens",
                param="messages",
                code="context_length_exceeded",
            )
        max_tokens = (
            chat.max_tokens if chat.max_tokens is not None else min(DEFAULT_MAX_TOKENS, room)
        )
        params = sampling_params(chat, max_tokens)  # raises BadRequest
        loop = loop or asyncio.get_running_loop()
        events: asyncio.Queue[EngineEvent] = asyncio.Queue()
        request = Request(
            prompt=prompt,
            params=params,
            session_id=session_id,
            sink=lambda event: loop.call_soon_threadsafe(events.put_nowait, event),
        )
        try:
            self.engine.submit(request)
        except PromptTooLong as exc:
            raise BadRequest(str(exc), param="max_tokens", code="context_length_exceeded") from exc
        return Generation(request=request, events=events, chat=chat)


OPENING_CUT = "\u2063phalanx-opening-ends-here\u2063"  # where an agent's opening ends


def opening_tokens(service: ChatService, chat: ChatRequest) -> list[int]:
    """The tokens every request of ``chat``'s agent starts with: ``chat.messages`` (its
    leading system messages, then a user message whose content is ``OPENING_CUT``) rendered
    as a request would be, cut where the user's words start, less the last token (which the
    user's words may merge with). Raises ``BadRequest`` as ``ChatService.start`` does."""
    text = service.rendered(chat)
    cut = text.find(OPENING_CUT)
    if cut < 0:
        raise BadRequest("the chat template drops the user's words", param="messages")
    return service.tokenized(text[:cut])[:-1]


def _grammar(chat: ChatRequest) -> str | None:
    """The GBNF for the request's tools or response format; ``BadRequest`` when a JSON schema
    in them cannot be turned into a grammar."""
    if chat.continue_final:  # free text: the tool-call grammar constrains an answer's start
        return None
    try:
        if chat.tool_mode:
            grammar = tool_grammar(chat.tool_mode)
        else:
            grammar = response_format_grammar(chat.response_format)
        return check_grammar(grammar) if grammar else None
    except Exception as exc:  # json_schema_to_gbnf raises many kinds on schemas it cannot take
        param = "tools" if chat.tool_mode else "response_format"
        raise BadRequest(
            f"{param}: the JSON schema cannot be turned into a grammar: {exc}",
            param=param,
            code="unsupported_schema",
        ) from exc


def sampling_params(chat: ChatRequest, max_tokens: int) -> SamplingParams:
    """The engine's ``SamplingParams`` for a validated request: every sampling field as sent
    (or its default from ``parse_chat_request``), the grammar of its tools or response format,
    and a random seed when the request names none. Raises ``BadRequest`` for a schema that
    cannot become a grammar."""
    grammar = _grammar(chat)
    extra = {"seed": chat.seed} if chat.seed is not None else {}
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=chat.temperature,
        top_p=chat.top_p,
        top_k=chat.top_k,
        min_p=chat.min_p,
        repeat_penalty=chat.repeat_penalty,
        frequency_penalty=chat.frequency_penalty,
        presence_penalty=chat.presence_penalty,
        stop=chat.stop,
        grammar=grammar,
        **extra,
    )


def _usage(done: Finished) -> dict[str, Any]:
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
    }


def _tool_calls(text: str) -> list[dict[str, Any]] | None:
    call = parse_tool_call(text)
    if call is None:
        return None
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(call.get("arguments", {}))},
        }
    ]


@dataclass
class CompletionShaper:
    """OpenAI-shaped output for one generation: ``model`` the name the client asked for,
    ``fingerprint`` (``system_fingerprint``) the ``name:version`` that serves it."""

    model: str
    node_id: str
    fingerprint: str = ""
    tools: bool = False
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))
    _held: str = ""
    _mode: str = "undecided"  # "text" or "tool" once the first character is known

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint or self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }

    def tool_call_broken(self, text: str) -> bool:
        """True when tools were offered and the answer began a tool call that does not
        parse (``phalanx_node_tool_parse_failures_total``)."""
        return (
            self.tools and text.lstrip().startswith(TOOL_OPEN[0]) and parse_tool_call(text) is None
        )

    def first_chunk(self) -> dict[str, Any]:
        return self._chunk({"role": "assistant", "content": ""})

    def delta_chunks(self, delta: TextDelta) -> list[dict[str, Any]]:
        """Chunks for a text delta; in tool mode a call is held back until it is complete."""
        if not self.tools or self._mode == "text":
            return [self._chunk({"content": delta.text})]
        self._held += delta.text
        if self._mode == "undecided" and self._held:
            self._mode = "tool" if self._held.startswith(TOOL_OPEN[0]) else "text"
            if self._mode == "text":
                held, self._held = self._held, ""
                return [self._chunk({"content": held})]
        return []

    def final_chunks(self, done: Finished) -> list[dict[str, Any]]:
        chunks = []
        reason = done.finish_reason
        if self._held:
            calls = _tool_calls(self._held)
            if calls:
                reason = "tool_calls"
                call = calls[0]
                chunks.append(
                    self._chunk(
                        {
                            "tool_calls": [
                                {
                                    "index": 0,
                                    "id": call["id"],
                                    "type": "function",
                                    "function": {"name": call["function"]["name"], "arguments": ""},
                                }
                            ]
                        }
                    )
                )
                chunks.append(
                    self._chunk(
                        {
                            "tool_calls": [
                                {
                                    "index": 0,
                                    "function": {"arguments": call["function"]["arguments"]},
                                }
                            ]
                        }
                    )
                )
            else:
                chunks.append(self._chunk({"content": self._held}))
        chunks.append(self._chunk({}, finish_reason=reason))
        usage = {**self._chunk({}), "choices": [], "usage": _usage(done), "timings": done.timings}
        chunks.append(usage)
        return chunks

    def completion(self, done: Finished) -> dict[str, Any]:
        calls = _tool_calls(done.text) if self.tools else None
        message: dict[str, Any] = {"role": "assistant", "content": None if calls else done.text}
        if calls:
            message["tool_calls"] = calls
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint or self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if calls else done.finish_reason,
                }
            ],
            "usage": _usage(done),
            "timings": done.timings,
        }


async def collect(generation: Generation) -> Finished | Failed:
    """Wait for the last event of a generation (text deltas are already in ``Finished.text``)."""
    while True:
        event = await generation.events.get()
        if isinstance(event, (Finished, Failed)):
            return event
