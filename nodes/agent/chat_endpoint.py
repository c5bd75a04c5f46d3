"""The node's chat endpoint (``POST /v1/chat/completions``): the request checked, handed to the
engine, answered whole or streamed, and its outcome counted for the package that served it."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from console.lib import logs
from inference.agent_prefix import agent_fingerprint
from inference.chat_request import decode_json, parse_chat_request
from inference.engine.request import Failed, Finished, QueueFull, TextDelta
from inference.engine.scheduler import Engine
from inference.errors import BadRequest
from inference.request_checks import request_id
from nodes.agent.asgi_io import (
    SSE_DONE,
    BodyTooLarge,
    Receive,
    Send,
    error_body,
    header,
    read_body,
    send_json,
    send_start,
    sse,
    watch_disconnect,
)
from nodes.agent.completions import ChatService, CompletionShaper, Generation, collect
from nodes.agent.node_state import JSON_LIMIT, NodeState
from nodes.agent.outcomes import Outcomes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Serving:
    """What serves one request from its start to its end: the chat service, engine, identity
    and outcome counters of the package the node served when it arrived."""

    service: ChatService | None
    engine: Engine
    identity: Any
    outcomes: Outcomes | None
    answer_model: str | None = None  # X-Phalanx-Model: the client-facing name (family)
    answer_package: str | None = None  # X-Phalanx-Package: name:version the proxy routed to


class ChatEndpoint(NodeState):
    """``POST /v1/chat/completions``: a completion, streamed (SSE) or whole, served to its end
    by the package the node served when it arrived."""

    async def _chat(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        try:
            raw = await read_body(receive, JSON_LIMIT)
        except BodyTooLarge as exc:
            return await self._error(send, 413, str(exc), code="body_too_large")
        # what serves this request, to its end, even if the node switches package meanwhile
        serving = Serving(self.service, self.engine, self.identity, self.outcomes)
        if serving.service is None:
            return await self._error(
                send, 503, "the model is still loading", code="loading", retry=True
            )
        if header(scope, "x-phalanx-probe") == "1":  # a control-plane check, not traffic
            serving = dataclasses.replace(serving, outcomes=None)
        serving = dataclasses.replace(
            serving,
            answer_model=header(scope, "x-phalanx-model"),
            answer_package=header(scope, "x-phalanx-package"),
        )
        try:
            rid = request_id(header(scope, "x-request-id"))
        except BadRequest as exc:
            return await self._error(send, 400, exc.message, code=exc.code, param=exc.param)
        # every log line of this request names it (this task's context: console.lib.logs)
        logs.bind(request_id=rid, session_id=header(scope, "x-session-id"))
        logs.bind(package=serving.answer_package or serving.identity.package)
        self._holding[id(serving.engine)] = self._holding.get(id(serving.engine), 0) + 1
        try:
            await self._serve_chat(scope, receive, send, raw, serving)
        finally:
            self._holding[id(serving.engine)] -= 1

    async def _serve_chat(
        self, scope: dict[str, Any], receive: Receive, send: Send, raw: bytes, serving: Serving
    ) -> None:
        identity, engine = serving.identity, serving.engine
        try:
            body = decode_json(raw)
            chat = parse_chat_request(_with_default_model(body, identity.package))
            if chat.model != identity.package:
                raise BadRequest(
                    f"model {chat.model!r} is not served by this node "
                    f"(it serves {identity.package!r})",
                    param="model",
                    code="model_not_found",
                )
            # rendering and tokenizing a long prompt is slow: off the loop, /health stays quick
            generation = await asyncio.to_thread(
                serving.service.start,
                chat,
                session_id=header(scope, "x-session-id"),
                loop=asyncio.get_running_loop(),
            )
        except BadRequest as exc:
            status = 404 if exc.code == "model_not_found" else 400
            return await self._error(send, status, exc.message, code=exc.code, param=exc.param)
        except QueueFull as exc:
            return await self._error(send, 503, str(exc), code="queue_full", retry=True)
        if serving.outcomes is not None:  # its prefix is in this node's KV from now on
            serving.outcomes.served_agent(agent_fingerprint(body["messages"], body.get("tools")))
        watcher = watch_disconnect(receive, lambda: engine.cancel(generation.request))
        try:
            if chat.stream:
                await self._stream(generation, send, serving)
            else:
                await self._complete(generation, send, serving)
        finally:
            watcher.cancel()
            engine.cancel(generation.request)  # no-op when finished; frees it otherwise

    def _shaper(self, generation: Generation, serving: Serving) -> CompletionShaper:
        """Answers name the model by its client-facing name (``X-Phalanx-Model``) and the version
        in ``system_fingerprint`` (``X-Phalanx-Package``); else the node's own name."""
        return CompletionShaper(
            model=serving.answer_model or serving.identity.package,
            node_id=self.identity.node_id,
            fingerprint=serving.answer_package or serving.identity.package,
            tools=_may_call(generation.chat),
        )

    async def _complete(self, generation: Generation, send: Send, serving: Serving) -> None:
        result = await collect(generation)
        _record(serving.outcomes, result, self._shaper(generation, serving))
        if isinstance(result, Failed) and result.client_error:
            return await self._error(send, 400, result.message, code="unsupported_schema")
        if isinstance(result, Failed):
            return await self._error(send, 500, result.message, code="engine_error")
        completion = self._shaper(generation, serving).completion(result)
        await send_json(send, 200, completion, self.headers)

    async def _stream(self, generation: Generation, send: Send, serving: Serving) -> None:
        shaper = self._shaper(generation, serving)
        await send_start(
            send, 200, "text/event-stream", {**self.headers, "cache-control": "no-cache"}
        )

        async def emit(payload: bytes) -> None:
            await send({"type": "http.response.body", "body": payload, "more_body": True})

        await emit(sse(shaper.first_chunk()))
        while True:
            event = await generation.events.get()
            if isinstance(event, TextDelta):
                for chunk in shaper.delta_chunks(event):
                    await emit(sse(chunk))
            elif isinstance(event, Finished):
                _record(serving.outcomes, event, shaper)
                for chunk in shaper.final_chunks(event):
                    await emit(sse(chunk))
                break
            elif isinstance(event, Failed):
                _record(serving.outcomes, event, shaper)
                await emit(sse(_failure_body(event)))
                break
        await send({"type": "http.response.body", "body": SSE_DONE, "more_body": False})


def _may_call(chat: Any) -> bool:
    """Whether the answer may be a tool call (the shaper holds a call back until complete);
    a continued answer is the text it continues."""
    return chat.tool_mode is not None and chat.tool_mode.allows_call and not chat.continue_final


def _record(outcomes: Outcomes | None, result: Finished | Failed, shaper: CompletionShaper) -> None:
    """Log a request's outcome (one line, under its request id) and count it for the package
    that served it (``outcomes`` None: a probe, neither logged nor counted)."""
    if outcomes is None:
        return
    _log_outcome(result)
    if isinstance(result, Failed):
        outcomes.record(failed=not result.client_error)
        return
    outcomes.record(
        ttft_ms=result.timings.get("ttft_ms"), tool_broken=shaper.tool_call_broken(result.text)
    )


def _log_outcome(result: Finished | Failed) -> None:
    if isinstance(result, Failed):
        log.warning("chat failed: %s", result.message, extra={"client_error": result.client_error})
        return
    fields = {
        "finish_reason": result.finish_reason,
        "prompt_tokens": result.prompt_tokens,
        "cached_tokens": result.cached_tokens,
        "completion_tokens": result.completion_tokens,
        "ttft_ms": result.timings.get("ttft_ms"),
    }
    log.info("chat answered", extra=fields)


def _failure_body(failed: Failed) -> dict[str, Any]:
    """The in-band error event of a failed stream: the request's fault (a grammar llama.cpp
    refused) is an ``invalid_request_error``, anything else the node's ``server_error``."""
    if failed.client_error:
        return error_body(failed.message, kind="invalid_request_error", code="unsupported_schema")
    return error_body(failed.message, kind="server_error", code="engine_error")


def _with_default_model(body: object, package: str) -> object:
    """Like llama-server, a node takes a body without ``model`` as one for what it serves."""
    if isinstance(body, dict) and "model" not in body:
        return {**body, "model": package}
    return body
