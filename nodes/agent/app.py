"""The node agent's HTTP API (an ASGI application): see docs/node-protocol.md."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

from inference.chat_request import decode_json, parse_chat_request
from inference.engine.request import Failed, Finished, QueueFull, TextDelta
from inference.engine.scheduler import Engine
from inference.engine.sequences import SessionBusy
from inference.engine.session_state import pack_state, unpack_state
from inference.errors import BadRequest
from nodes.agent.asgi_io import (
    SSE_DONE,
    BodyTooLarge,
    ClientGone,
    Receive,
    Send,
    error_body,
    header,
    read_body,
    send_bytes,
    send_json,
    send_start,
    sse,
    watch_disconnect,
)
from nodes.agent.auth import CredentialCheck
from nodes.agent.completions import ChatService, CompletionShaper, Generation, collect
from nodes.agent.metrics import prometheus_text
from nodes.agent.outcomes import Outcomes
from nodes.agent.switch import SwitchRefused, SwitchRequest, SwitchStatus, load_engine, retire
from nodes.agent.validation import DeviceValidation, ValidationBusy

JSON_LIMIT = 8 << 20
STATE_LIMIT = 1 << 30
RETRY_AFTER_S = "1"


@dataclass(frozen=True)
class Route:
    """One line of the node's URL table: path pattern, allowed methods (empty: any), the
    ``NodeApp`` method that answers, whether it answers without the credential (only
    ``/health``), and an example path (tests call every route)."""

    pattern: re.Pattern[str]
    methods: tuple[str, ...]
    handler: str
    example: str
    public: bool = False


ROUTES = (
    Route(re.compile(r"^/health$"), ("GET", "HEAD"), "_health", "/health", public=True),
    Route(re.compile(r"^/metrics$"), ("GET",), "_metrics", "/metrics"),
    Route(re.compile(r"^/slots$"), ("GET",), "_slots", "/slots"),
    Route(re.compile(r"^/v1/models$"), ("GET",), "_models_list", "/v1/models"),
    Route(re.compile(r"^/package$"), ("GET", "PUT"), "_package", "/package"),
    Route(re.compile(r"^/validation$"), ("GET", "POST"), "_validation", "/validation"),
    Route(re.compile(r"^/v1/chat/completions$"), ("POST",), "_chat", "/v1/chat/completions"),
    Route(
        re.compile(r"^/sessions/(?P<sid>[^/]{1,200})(?P<state>/state)?/?$"),
        ("GET", "PUT", "DELETE"),
        "_session",
        "/sessions/s-1/state",
    ),
)


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


@dataclass
class NodeIdentity:
    """Who the node is: its id, the package it serves, its GGUF's sha256 and its array's id."""

    node_id: str
    package: str
    model_sha256: str = ""
    array_id: str = ""


class NodeApp:
    """Routes requests to the engine. ``service`` is set once the engine has loaded."""

    def __init__(
        self,
        identity: NodeIdentity,
        engine: Engine,
        service_factory,
        credentials: CredentialCheck,
        devices: DeviceValidation | None = None,
    ) -> None:
        self.identity = identity
        self.devices = devices  # device validation (None: this node does not validate)
        self.credentials = credentials
        self.engine = engine
        self._service_factory = service_factory
        self._service: ChatService | None = None
        self.switch: SwitchStatus | None = None
        self.outcomes = Outcomes()  # of the package served now (a switch starts afresh)
        self._holding: dict[int, int] = {}  # id(engine) -> requests that captured it

    @property
    def service(self) -> ChatService | None:
        if self._service is None and self.engine.ready.is_set():
            self._service = self._service_factory(self.engine)
        return self._service

    @property
    def headers(self) -> dict[str, str]:
        return {"x-phalanx-node": self.identity.node_id}

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            await self._route(scope, receive, send)
        except ClientGone:
            return

    async def _route(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        method, path = scope["method"], scope["path"]
        for route in ROUTES:
            match = route.pattern.match(path)
            if match is None:
                continue
            public = route.public and method in route.methods
            if not public and not self.credentials.accepts(header(scope, "authorization")):
                return await self._unauthorized(send)
            if route.methods and method not in route.methods:
                allowed = ", ".join(route.methods)
                return await self._error(send, 405, f"use {allowed}", code="method_not_allowed")
            handler = getattr(self, route.handler)
            return await handler(scope, receive, send, **match.groupdict())
        if not self.credentials.accepts(header(scope, "authorization")):
            return await self._unauthorized(send)  # not even the URL table to strangers
        return await self._error(send, 404, f"no such endpoint: {method} {path}", code="not_found")

    async def _unauthorized(self, send: Send) -> None:
        body = error_body(
            "This node answers only its control plane: send 'Authorization: Bearer <node "
            "credential>' (docs/node-protocol.md).",
            kind="authentication_error",
            code="unauthorized",
        )
        await send_json(send, 401, body, {**self.headers, "www-authenticate": "Bearer"})

    async def _metrics(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        snapshot = {**self.engine.snapshot(), **self.outcomes.snapshot()}
        body = prometheus_text(self.identity.node_id, snapshot).encode()
        await send_bytes(send, 200, body, "text/plain; version=0.0.4", self.headers)

    async def _slots(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await send_json(send, 200, self.engine.slots(), self.headers)

    async def _models_list(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await send_json(send, 200, self._models(), self.headers)

    async def _error(
        self,
        send: Send,
        status: int,
        message: str,
        *,
        code: str,
        param: str | None = None,
        retry: bool = False,
    ) -> None:
        extra = {**self.headers, **({"retry-after": RETRY_AFTER_S} if retry else {})}
        kind = "invalid_request_error" if status < 500 else "overloaded_error"
        await send_json(send, status, error_body(message, kind=kind, code=code, param=param), extra)

    async def _health(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if self.engine.load_error:
            return await send_json(
                send, 500, {"status": "error", "error": self.engine.load_error}, self.headers
            )
        if not self.engine.ready.is_set():
            return await send_json(
                send, 503, {"status": "loading"}, {**self.headers, "retry-after": RETRY_AFTER_S}
            )
        snap = self.engine.snapshot()
        return await send_json(
            send,
            200,
            {
                "status": "ok",
                "node": self.identity.node_id,
                "array": self.identity.array_id,
                "model": self.identity.package,
                "sha256": self.identity.model_sha256,
                "switch": self.switch.as_dict() if self.switch else None,
                "pid": os.getpid(),
                "sequences_active": snap["sequences_active"],
                "queue_depth": snap["queue_depth"],
                "kv": snap["kv_settings"],
                "kv_layout": snap["kv_layout"],
                "host_ram_budget_bytes": snap["host_ram_budget_bytes"],
                "chat_template": self._template_status(),
                "device": self.devices.health() if self.devices else None,
            },
            self.headers,
        )

    def _template_status(self) -> str:
        """``"ok"``, or why chat completions are refused (no template, one that fails)."""
        service = self.service
        return (service.formatter.load_error or "ok") if service else "loading"

    def _models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": self.identity.package, "object": "model", "owned_by": self.identity.node_id}
            ],
        }

    # Chat -------------------------------------------------------------------------------

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
            chat = parse_chat_request(_with_default_model(decode_json(raw), identity.package))
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
            tools=generation.chat.tool_mode is not None and generation.chat.tool_mode.allows_call,
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

    # Package switch ---------------------------------------------------------------------

    async def _package(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """GET: what the node serves and its last switch. PUT: switch (202; 409 while one
        runs; 400 naming what is wrong). See nodes/agent/switch.py."""
        if scope["method"] == "PUT":
            try:
                request = SwitchRequest.from_body(decode_json(await read_body(receive, JSON_LIMIT)))
            except (SwitchRefused, BadRequest, BodyTooLarge) as exc:
                return await self._error(send, 400, str(exc), code="invalid_switch")
            if self.switch is not None and self.switch.running:
                return await self._error(
                    send, 409, f"a switch to {self.switch.package} is under way", code="switching"
                )
            self.switch = SwitchStatus(request.package, request.sha256)
            loop = asyncio.get_running_loop()
            threading.Thread(
                target=self._load, args=(request, self.switch, loop), name="switch", daemon=True
            ).start()
            return await send_json(send, 202, self._package_state(), self.headers)
        return await send_json(send, 200, self._package_state(), self.headers)

    def _package_state(self) -> dict[str, Any]:
        config = self.engine.config
        return {
            "package": self.identity.package,
            "sha256": self.identity.model_sha256,
            "model_path": config.model_path,
            "settings": {
                "threads": config.threads,
                "sequences": config.sequences,
                "ctx_per_seq": config.ctx_per_seq,
                "host_ram_mib": config.host_ram_mib,
            },
            "switch": self.switch.as_dict() if self.switch else None,
        }

    def _load(
        self, request: SwitchRequest, status: SwitchStatus, loop: asyncio.AbstractEventLoop
    ) -> None:
        """On a thread of its own: load the new engine, then hand it to the event loop."""
        try:
            engine = load_engine(request, self.engine.config, status)
        except Exception as exc:  # the old engine goes on serving; the status says why
            status.fail(f"the switch failed: {exc}")
            return
        if engine is not None:
            identity = dataclasses.replace(
                self.identity, package=request.package, model_sha256=request.sha256
            )
            loop.call_soon_threadsafe(self._adopt, engine, identity, status)

    def _adopt(self, engine: Engine, identity: NodeIdentity, status: SwitchStatus) -> None:
        """On the event loop, in one step: the new engine serves every request from now."""
        old = self.engine
        self.engine, self.identity, self._service = engine, identity, None
        self.outcomes = Outcomes()
        status.state, status.finished_at = "done", time.time()
        retire(old)

    # Device validation ------------------------------------------------------------------

    async def _validation(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """POST ``{"run": id}``: start a validation run (202; the same id again answers its
        state; 409 while another runs). GET: the last run's state, progress and report."""
        if self.devices is None:
            return await self._error(
                send, 404, "this node does not run device validation", code="not_found"
            )
        if scope["method"] == "POST":
            try:
                body = decode_json(await read_body(receive, JSON_LIMIT))
                run_id = body.get("run") if isinstance(body, dict) else None
                task = self.devices.start(str(run_id) if isinstance(run_id, str) else "")
            except (BadRequest, BodyTooLarge, ValueError) as exc:
                return await self._error(send, 400, str(exc), code="invalid_validation")
            except ValidationBusy as exc:
                return await self._error(send, 409, str(exc), code="validation_busy")
            return await send_json(send, 202, task.as_dict(), self.headers)
        task = self.devices.task
        body = task.as_dict() if task else {"run": None, "state": "none"}
        return await send_json(send, 200, {**body, "instance": self.devices.instance}, self.headers)

    # Sessions ---------------------------------------------------------------------------

    async def _session(
        self,
        scope: dict[str, Any],
        receive: Receive,
        send: Send,
        *,
        sid: str,
        state: str | None,
    ) -> None:
        method, session_id = scope["method"], sid
        engine, identity = self.engine, self.identity  # one package, whatever a switch does
        if not engine.ready.is_set():
            return await self._error(
                send, 503, "the model is still loading", code="loading", retry=True
            )
        table = engine.table
        try:
            if method == "GET" and not state:
                where = await self._on_engine(
                    engine, lambda: table.locate(session_id, engine.kv_bytes_per_token)
                )
                if where is None:
                    return await self._error(
                        send, 404, f"no KV held for session {session_id!r}", code="unknown_session"
                    )
                return await send_json(send, 200, {"session_id": session_id, **where}, self.headers)
            if method == "GET" and state:
                entry = await self._on_engine(engine, lambda: table.export(session_id))
                if entry is None:
                    return await self._error(
                        send, 404, f"no KV held for session {session_id!r}", code="unknown_session"
                    )
                blob = pack_state(entry, model_sha256=identity.model_sha256)
                return await send_bytes(send, 200, blob, "application/octet-stream", self.headers)
            if method == "PUT" and state:
                return await self._import(session_id, receive, send, engine, identity)
            if method == "DELETE" and not state:
                found = await self._on_engine(engine, lambda: table.erase(session_id))
                return await send_json(
                    send, 200, {"session_id": session_id, "erased": found}, self.headers
                )
        except SessionBusy:
            return await self._error(
                send, 409, f"session {session_id!r} has a request in flight", code="session_busy"
            )
        return await self._error(
            send, 405, f"{method} is not allowed here", code="method_not_allowed"
        )

    async def _import(
        self, session_id: str, receive: Receive, send: Send, engine: Engine, identity: Any
    ) -> None:
        try:
            entry, sha = unpack_state(await read_body(receive, STATE_LIMIT))
        except (ValueError, BodyTooLarge) as exc:
            return await self._error(send, 400, str(exc), code="invalid_state")
        if sha and identity.model_sha256 and sha != identity.model_sha256:
            return await self._error(
                send, 409, "state was exported from another model", code="model_mismatch"
            )
        kept = await self._on_engine(engine, lambda: engine.table.import_(session_id, entry))
        if not kept:
            return await self._error(
                send, 507, "state exceeds the host RAM budget", code="over_budget"
            )
        return await send_json(
            send,
            200,
            {
                "session_id": session_id,
                "where": "host",
                "tokens": len(entry.tokens),
                "bytes": len(entry.blob),
            },
            self.headers,
        )

    @staticmethod
    async def _on_engine(engine: Engine, fn):
        return await asyncio.wrap_future(engine.call(fn))


def _record(outcomes: Outcomes | None, result: Finished | Failed, shaper: CompletionShaper) -> None:
    """Count a request's outcome for the package that served it (None: a probe, not counted)."""
    if outcomes is None:
        return
    if isinstance(result, Failed):
        outcomes.record(failed=not result.client_error)
        return
    outcomes.record(
        ttft_ms=result.timings.get("ttft_ms"), tool_broken=shaper.tool_call_broken(result.text)
    )


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


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
