"""Session websocket ``/ws/sessions/<session_id>/``: chat with a stored transcript.

Client -> server: ``{"type": "user", "content": "..."}`` (``{"message": ...}`` and
``{"content": ...}`` too) or a tool result ``{"type": "tool", "tool_call_id": "...",
"content": "..."}``, each with optional ``model``, ``max_tokens``, ``temperature``, ``top_p``,
``seed``, ``stop``, and ``tools`` / ``tool_choice`` (OpenAI's shapes; a message without
``tools`` uses the last ones this connection sent, ``tool_choice`` applies to its own turn). Server -> client: ``{"type": "delta", "content"}``
per token; ``{"type": "tool_call", "id", "name", "arguments"}`` for each call the model makes;
then ``{"type": "done", "node": "node-01", "model": family, "package": "name:version" that
served, "content": full reply, "tool_calls", "finish_reason",
"usage", "timings"}``; or ``{"type": "error", "message", "code", "param"}``. One turn at a time
per connection. Each turn is validated as the REST proxy validates a request.

The session is the same ``SessionRoute`` the REST proxy pins (same service, same log). The
transcript grows by the client's message and the reply (with its tool calls) only when a turn
completes, so a failed turn can simply be sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from asgiref.sync import sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from console.lib import logs
from inference import lookups, proxy, selectors, tokens, transcripts
from inference.chat_request import decode_json
from inference.errors import AuthError, BadRequest, NoHealthyNode, NoRole, ProxyError
from inference.migration import sse_events
from inference.relay import Upstream
from inference.request_checks import WsTurn, check_chat_body, check_session_id, parse_ws_message
from inference.usage.limits import cap_max_tokens
from inference.usage.quotas import Caller
from inference.usage.turns import open_ticket, release

CLOSE_UNAUTHORIZED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_CODES = {AuthError: CLOSE_UNAUTHORIZED, NoRole: CLOSE_FORBIDDEN}


@sync_to_async
def _authenticate(scope: dict[str, Any]) -> Caller:
    """Whom the turns count against: a logged-in user with a role (``NoRole`` without one,
    as on every page), else the API token of ``?token=`` or ``Authorization``
    (``AuthError``)."""
    user = scope.get("user")
    if user is not None and getattr(user, "is_authenticated", False):
        from console.lib.access import role_of_user

        role = role_of_user(user)
        if role is None:
            raise NoRole("Your account has no role; an admin must give it one.")
        return lookups.caller_for_user(user.get_username(), str(getattr(role, "value", role)))
    query = scope.get("query_string", b"").decode("latin1")
    from urllib.parse import parse_qs

    token = (parse_qs(query).get("token") or [None])[0]
    if token is None:
        headers = {
            k.decode("latin1").lower(): v.decode("latin1") for k, v in scope.get("headers", [])
        }
        token = tokens.bearer_token(headers.get("authorization"))
    return lookups.caller_for_token(token)


@sync_to_async
def _prepare_turn(session_id: str, turn: WsTurn) -> tuple[str, list[dict[str, Any]]]:
    """The client-facing name to use (``lookups.model_for_request``: the family) and the
    messages to send: the transcript plus the new one."""
    name = turn.model or transcripts.session_package_name(session_id=session_id)
    if name is None:
        default = selectors.package_default()
        if default is None:
            raise NoHealthyNode("No model package is registered.", retry_after=5)
        name = selectors.served_name(default)
    model = lookups.model_for_request(name)
    history = transcripts.transcript_get(session_id=session_id)
    if turn.message["role"] == "tool":
        _check_answers_a_call(history, turn.message["tool_call_id"])
    return model, [*history, turn.message]


def _check_answers_a_call(history: list[dict[str, Any]], call_id: str) -> None:
    """Raises ``BadRequest`` unless ``call_id`` is a call of the session's last reply that no
    tool result has answered yet."""
    pending: list[str] = []
    for message in history:
        if message.get("role") == "assistant":
            pending = [c.get("id") for c in message.get("tool_calls") or []]
        elif message.get("role") == "tool" and message.get("tool_call_id") in pending:
            pending.remove(message["tool_call_id"])
    if call_id not in pending:
        waiting = ", ".join(pending) if pending else "none"
        raise BadRequest(
            f"tool_call_id {call_id!r} answers no open tool call of this session (open: "
            f"{waiting}).",
            param="tool_call_id",
            code="unknown_tool_call",
        )


_append = sync_to_async(transcripts.transcript_append)


class SessionConsumer(AsyncJsonWebsocketConsumer):
    """Thin consumer: parse, then run one turn as a task that a disconnect cancels."""

    session_id: str
    caller: Caller | None = None  # None until authenticated
    turn_task: asyncio.Task[None] | None = None
    tools: list[Any] | None = None  # the last tools this connection sent

    async def connect(self) -> None:
        self.session_id = self.scope["url_route"]["kwargs"]["session_id"]
        await self.accept()
        try:
            check_session_id(self.session_id)
        except BadRequest as exc:
            await self.send_error(exc)
            await self.close(code=4400)
            return
        try:
            self.caller = await _authenticate(self.scope)
        except (AuthError, NoRole) as exc:
            await self.send_error(exc)
            await self.close(code=CLOSE_CODES[type(exc)])

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.caller is None:
            return
        try:
            if text_data is None:
                raise BadRequest("Send JSON text frames.", code="invalid_json")
            turn = parse_ws_message(decode_json(text_data))
            if self.turn_task is not None and not self.turn_task.done():
                raise BadRequest(
                    "A turn is already running; wait for its done event.", code="turn_in_progress"
                )
            # a token revoked (a role taken, a quota changed) since connect
            self.caller = await _authenticate(self.scope)
        except (AuthError, NoRole) as exc:
            await self.send_error(exc)
            await self.close(code=CLOSE_CODES[type(exc)])
            return
        except ProxyError as exc:
            await self.send_error(exc)
            return
        self.turn_task = asyncio.create_task(self.run_turn(turn))

    async def disconnect(self, code: int) -> None:
        task = self.turn_task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def send_error(self, exc: ProxyError, request_id: str = "") -> None:
        event: dict[str, Any] = {"type": "error", "message": exc.message, "code": exc.code}
        if request_id:
            event["request_id"] = request_id
        if exc.param is not None:
            event["param"] = exc.param
        if exc.retry_after is not None:
            event["retry_after"] = exc.retry_after
        await self.send_json(event)

    async def run_turn(self, turn: WsTurn) -> None:
        """Validate, route, stream deltas and tool calls, then store the exchange and send
        ``done`` (each event of the turn names its ``request_id``)."""
        logs.bind(request_id=turn.request_id, session_id=self.session_id)
        try:
            model, messages = await _prepare_turn(self.session_id, turn)
            tools = turn.tools["tools"] if "tools" in turn.tools else self.tools
            payload = {
                "model": model,
                "messages": messages,
                "stream": True,
                "stream_options": {"include_usage": True},
                **turn.options,
                **({"tools": tools} if tools else {}),
                **(
                    {"tool_choice": turn.tools["tool_choice"]}
                    if "tool_choice" in turn.tools
                    else {}
                ),
            }
            assert self.caller is not None
            payload = cap_max_tokens(check_chat_body(payload), self.caller.limits)
            self.tools = tools  # kept for later turns only once they passed
            upstream = await self._opened(payload, model, turn.request_id)
            if upstream.status != 200:
                body = await upstream.read_all()
                raise _node_error(upstream.status, body, upstream.node_id)
            reply, done = await self.relay(upstream)
            if done is None:
                return
            await _append(session_id=self.session_id, messages=[messages[-1], reply])
            await self.send_json(done)
        except ProxyError as exc:
            await self.send_error(exc, turn.request_id)

    async def _opened(self, payload: dict[str, Any], model: str, request_id: str) -> Upstream:
        """Admit the turn (``OverLimit``: an error event with ``retry_after``) and open the
        node's answer; the admission goes back when no node answers."""
        assert self.caller is not None
        ticket = await open_ticket(self.caller, await lookups.arouting_policy())
        try:
            return await proxy.upstream_open(
                payload=payload,
                model=model,
                session_id=self.session_id,
                request_id=request_id,
                ticket=ticket,
            )
        except BaseException:
            await release(ticket)
            raise

    async def _pass_on(self, event: dict[str, Any], answer: Answer, done: dict[str, Any]) -> None:
        """Send an SSE chunk's content as ``delta`` events, gather its tool-call pieces; note
        finish reason, usage, timings."""
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if content:
                answer.parts.append(content)
                await self.send_json({"type": "delta", "content": content})
            for piece in delta.get("tool_calls") or []:
                answer.add_tool_call_piece(piece)
            if choice.get("finish_reason"):
                done["finish_reason"] = choice["finish_reason"]
        for key in ("usage", "timings", "migrated"):
            if event.get(key):
                done[key] = event[key]
        if event.get("migrated"):  # the answer went on on another node (inference.migration)
            done["node"] = event["migrated"]["to"]

    async def relay(self, upstream: Upstream) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """Send deltas and tool calls; returns the assistant message for the transcript and
        the done event (None after an error)."""
        answer = Answer()
        done: dict[str, Any] = {
            "type": "done",
            "request_id": upstream.request_id,
            "node": upstream.node_id,
            "model": upstream.payload.get("model"),
            "package": upstream.package,
            "usage": None,
            "timings": None,
            "finish_reason": None,
        }
        error: dict[str, Any] | None = None
        # aclosing: the upstream is closed (and its route written) before the client hears
        # the turn's end, not whenever the generator is collected
        async with contextlib.aclosing(sse_events(upstream)) as events:
            async for event in events:
                if event == "[DONE]":
                    break
                if not isinstance(event, dict):
                    continue
                if "error" in event:
                    error = _error_event(event["error"], upstream.node_id)
                    error["request_id"] = upstream.request_id
                    break
                await self._pass_on(event, answer, done)
        if error is not None:
            await self.send_json(error)
            return answer.message(), None
        for call in answer.tool_calls():
            await self.send_json({"type": "tool_call", **_flat_call(call)})
        message = answer.message()
        done["content"] = "".join(answer.parts)
        done["tool_calls"] = [_flat_call(c) for c in answer.tool_calls()]
        return message, done


class Answer:
    """The assistant message being streamed: text parts and tool calls gathered from their
    pieces (OpenAI streams a call as ``tool_calls`` deltas: id and name first, then arguments
    in fragments, each keyed by ``index``)."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}

    def add_tool_call_piece(self, piece: dict[str, Any]) -> None:
        call = self._calls.setdefault(
            int(piece.get("index") or 0),
            {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
        )
        call["id"] = piece.get("id") or call["id"]
        function = piece.get("function") or {}
        call["function"]["name"] += function.get("name") or ""
        call["function"]["arguments"] += function.get("arguments") or ""

    def tool_calls(self) -> list[dict[str, Any]]:
        return [self._calls[i] for i in sorted(self._calls)]

    def message(self) -> dict[str, Any]:
        """The assistant message for the transcript (OpenAI's shape)."""
        text = "".join(self.parts)
        calls = self.tool_calls()
        if not calls:
            return {"role": "assistant", "content": text}
        return {"role": "assistant", "content": text or None, "tool_calls": calls}


def _flat_call(call: dict[str, Any]) -> dict[str, Any]:
    """A tool call as the websocket sends it: ``{"id", "name", "arguments"}``."""
    return {
        "id": call["id"],
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"],
    }


def _error_event(error: Any, node_id: str) -> dict[str, Any]:
    """The websocket ``error`` event for a node's in-band SSE error."""
    details = error if isinstance(error, dict) else {}
    return {
        "type": "error",
        "node": node_id,
        "message": details.get("message", str(error)),
        "code": details.get("code", "upstream_error"),
    }


def _node_error(status: int, body: bytes, node_id: str) -> ProxyError:
    """A node's refusal of the turn as the error a REST client would get: the node's own
    ``message``, ``code`` (``context_length_exceeded`` ...) and ``param``."""
    try:
        error = json.loads(body)["error"]
        message, code, param = str(error["message"]), error.get("code"), error.get("param")
    except (ValueError, KeyError, TypeError, RecursionError, AttributeError):
        message, code, param = body.decode("utf-8", "replace")[:500] or f"HTTP {status}", None, None
    return ProxyError(message, code=code or "node_error", status=status, param=param)
