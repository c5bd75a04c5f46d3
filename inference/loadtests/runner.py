"""The load generator: runs a scenario's sessions against an OpenAI-compatible ``/v1``.

Sessions talk to the target the way a client does: the ``openai`` package's ``AsyncOpenAI``,
streamed (``stream: true`` with ``stream_options.include_usage``), its own SSE parsing, the
session key in ``X-Session-Id``, the whole history sent each turn (the node reuses the
session's KV for the common prefix). Each request becomes a turn record (``turns``, shape in
``inference.loadtests.analysis``); the node's ``timings`` (queue wait, prefill) ride on the
last chunk and the node's id on ``X-Phalanx-Node``.

``LoadRun.run`` goes through the scenario's steps from ``start_step`` and calls its hooks
(all async, run on its event loop): ``tick(live)`` once a second with the live figures,
``step_done(step, turns, sessions)`` after each step (a resumed run starts after the last
one), and it polls ``should_stop()`` every ``STOP_POLL_S``: a stop cancels every open request
at once (the node cancels the generation when its client goes away) and keeps what finished.
Bounds: the scenario's ``max_s`` (from the run's first start) and ``max_requests``.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import openai

from inference.loadtests import analysis
from inference.loadtests.plan import SYSTEM_PROMPT, TOOLS, SessionPlan, plan_session, plan_sessions
from inference.loadtests.scenario import Scenario
from inference.loadtests.turns import (
    Reply,
    TurnRecord,
    _figure,
    _take_chunk,
    _tool_message,
    error_kind,
    tool_call_valid,
)

STOP_POLL_S = 0.25
TICK_S = 1.0
WINDOW_S = 10.0  # the live figures' window
REQUEST_TIMEOUT = httpx.Timeout(120.0, connect=5.0)
PROBE_TIMEOUT_S = 5.0


def direct_client(timeout: float | httpx.Timeout) -> httpx.AsyncClient:
    """An HTTP client for requests that carry the run's token: straight to the target, never
    through a proxy named by the environment (``HTTP_PROXY``...) and never redirected
    elsewhere, so the token reaches only the address the run was given (or proved)."""
    return httpx.AsyncClient(timeout=timeout, trust_env=False, follow_redirects=False)


@dataclass
class Target:
    """Where the load goes: the ``/v1`` base ``url`` (scheme, host, port), a Bearer ``token``,
    the ``model`` to ask for."""

    url: str
    token: str
    model: str


class LoadRun:
    """One run of ``scenario`` against ``target`` (see the module docstring)."""

    def __init__(
        self,
        scenario: Scenario,
        target: Target,
        *,
        run_tag: str,
        start_step: int = 0,
        elapsed_s: float = 0.0,
        requests_before: int = 0,
        should_stop: Callable[[], Awaitable[bool]],
        tick: Callable[[dict[str, Any]], Awaitable[None]],
        step_done: Callable[[dict[str, Any], list[dict], list[dict]], Awaitable[None]],
        sample_array: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    ) -> None:
        self.scenario, self.target, self.run_tag = scenario, target, run_tag
        self.start_step = start_step
        self.should_stop, self.tick, self.step_done = should_stop, tick, step_done
        self.sample_array = sample_array
        self.origin = time.monotonic() - elapsed_s  # "t" of records: seconds since the run began
        self.requests = requests_before  # sent, all attempts
        self.answered_before = requests_before  # earlier attempts' records are all finished
        self.turns: list[TurnRecord] = []  # this attempt's finished turns (all steps)
        self.step_turns: list[TurnRecord] = []
        self.step_sessions: list[dict[str, Any]] = []
        self.open_sessions = 0
        self.step_index = start_step
        self.step_started = 0.0
        self.stopped = False
        self.bounded_by = ""
        self.console_supported = True
        self.plans = {
            i: plan_sessions(scenario, run_tag=run_tag, step=i, count=c)
            for i, c in enumerate(scenario.steps)
        }
        self.client = openai.AsyncOpenAI(
            base_url=f"{target.url.rstrip('/')}/v1",
            api_key=target.token,
            max_retries=0,
            timeout=REQUEST_TIMEOUT,
            http_client=direct_client(REQUEST_TIMEOUT),
        )
        self.http = direct_client(PROBE_TIMEOUT_S)

    # --- the run ---------------------------------------------------------------------------

    def now(self) -> float:
        return time.monotonic() - self.origin

    async def run(self) -> str:
        """Run the remaining steps; returns how it ended: "succeeded" (every step, or a bound
        reached: ``bounded_by`` says which) or "stopped"."""
        ticker = asyncio.create_task(self._ticker())
        try:
            for index in range(self.start_step, len(self.scenario.steps)):
                if self.stopped or self.bounded_by:
                    break
                await self._step(index)
        finally:
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
            await self.client.close()
            await self.http.aclose()
        return "stopped" if self.stopped else "succeeded"

    async def _step(self, index: int) -> None:
        c = self.scenario.steps[index]
        self.step_index, self.step_started = index, self.now()
        self.step_turns, self.step_sessions = [], []
        deadline = self.step_started + self.scenario.hold_s if self.scenario.timed else None
        if self.scenario.timed:
            workers = [self._virtual_user(index, u, deadline) for u in range(c)]
        else:
            workers = [self._session(plan, deadline) for plan in self.plans[index]]
        tasks = [asyncio.create_task(w) for w in workers]
        watcher = asyncio.create_task(self._watch_stop(tasks))
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        step = {"step": index, "c": c, "started": self.step_started, "ended": self.now()}
        await self.step_done(step, [t.as_dict() for t in self.step_turns], list(self.step_sessions))

    async def _watch_stop(self, tasks: list[asyncio.Task]) -> None:
        """Cancel the step's tasks when a stop is asked for or ``max_s`` has passed."""
        while True:
            await asyncio.sleep(STOP_POLL_S)
            if self.now() >= self.scenario.max_s:
                self.bounded_by = "max_s"
            elif await self.should_stop():
                self.stopped = True
            else:
                continue
            for task in tasks:
                task.cancel()
            return

    async def _virtual_user(self, step: int, user: int, deadline: float | None) -> None:
        """Sessions back to back until the step's deadline (ramp, steady)."""
        n = 0
        while not self._over(deadline):
            plan = plan_session(
                self.scenario,
                session_id=f"lt-{self.run_tag}-s{step}-u{user}-{n}",
                step=step,
                index=user * 10_000 + n,
            )
            await self._session(plan, deadline)
            n += 1

    def _over(self, deadline: float | None) -> bool:
        if self.requests >= self.scenario.max_requests:
            self.bounded_by = self.bounded_by or "max_requests"
            return True
        return deadline is not None and self.now() >= deadline

    # --- one session, one turn ---------------------------------------------------------------

    async def _session(self, plan: SessionPlan, deadline: float | None) -> None:
        c = self.scenario.steps[plan.step]
        agent = self.scenario.conversation == "agent"
        messages: list[dict[str, Any]] = (
            [{"role": "system", "content": SYSTEM_PROMPT}] if agent else []
        )
        started, nodes, complete, pending, prompt_before = self.now(), [], False, None, 0
        self.open_sessions += 1
        try:
            for k, planned in enumerate(plan.turns):
                await self._think(planned.think_s, deadline)
                if self._over(deadline):
                    break
                if pending is not None:
                    messages.append(_tool_message(pending))
                    kind, required = "tool_result", False
                else:
                    messages.append({"role": "user", "content": planned.text})
                    kind, required = "user", planned.tool_required
                record, reply = await self._turn(plan, k, kind, messages, required, prompt_before)
                if record.node and record.node not in nodes:
                    nodes.append(record.node)
                if not record.ok or reply is None:
                    break
                messages.append(reply.assistant_message())
                calls = [reply.calls[i] for i in sorted(reply.calls)]
                pending = calls[0] if calls else None
                prompt_before = record.prompt
            else:
                complete = True  # every turn answered: not cut by a deadline, a stop or an error
        finally:
            self.open_sessions -= 1
            self.step_sessions.append(
                {
                    "step": plan.step,
                    "c": c,
                    "sid": plan.session_id,
                    "t": round(started, 4),
                    "dur": round(self.now() - started, 4),
                    "turns": len(plan.turns),
                    "complete": complete,
                    "nodes": nodes,
                }
            )

    async def _think(self, seconds: float, deadline: float | None) -> None:
        """Wait the think time, but not past the step's deadline."""
        if deadline is not None:
            seconds = min(seconds, max(0.0, deadline - self.now()))
        if seconds > 0:
            await asyncio.sleep(seconds)

    async def _turn(
        self,
        plan: SessionPlan,
        k: int,
        kind: str,
        messages: list[dict[str, Any]],
        required: bool,
        prompt_before: int,
    ) -> tuple[TurnRecord, Reply | None]:
        record = TurnRecord(
            step=plan.step,
            c=self.scenario.steps[plan.step],
            sid=plan.session_id,
            turn=k,
            kind=kind,
            t=self.now(),
            tool_req=required,
        )
        self.requests += 1
        sent = time.monotonic()
        reply = None
        try:
            reply = await self._stream(plan.session_id, messages, required, record, sent)
        except asyncio.CancelledError:
            raise  # a stop: the turn did not finish, so it is not a record
        except Exception as exc:  # the target's failure is the turn's outcome
            record.error, record.message = error_kind(exc)
        record.lat = time.monotonic() - sent
        if reply is not None:
            self._take_reply(record, reply, prompt_before)
        self.step_turns.append(record)
        self.turns.append(record)
        return record, reply if record.ok else None

    async def _stream(
        self,
        session_id: str,
        messages: list[dict[str, Any]],
        required: bool,
        record: TurnRecord,
        sent: float,
    ) -> Reply:
        body: dict[str, Any] = {
            "model": self.target.model,
            "messages": messages,
            "max_tokens": self.scenario.tool_max_tokens if required else self.scenario.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.scenario.conversation == "agent":
            body.update(tools=TOOLS, tool_choice="required" if required else "auto")
        reply = Reply()
        async with self.client.chat.completions.with_streaming_response.create(
            **body, extra_headers={"X-Session-Id": session_id}
        ) as response:
            record.node = response.headers.get("x-phalanx-node", "")
            stream = await response.parse()
            async for chunk in stream:
                if _take_chunk(reply, chunk) and record.ttft is None:
                    record.ttft = time.monotonic() - sent
        return reply

    def _take_reply(self, record: TurnRecord, reply: Reply, prompt_before: int) -> None:
        if reply.finish is None:
            record.error, record.message = "incomplete", "the stream ended without a finish reason"
            return
        record.ok = True
        usage = reply.usage
        if usage is not None:
            record.prompt = usage.prompt_tokens or 0
            record.completion = usage.completion_tokens or 0
            details = usage.prompt_tokens_details
            record.cached = (details.cached_tokens or 0) if details else 0
        record.finish = reply.finish
        record.queue_ms = _figure(reply.timings, "queue_ms")
        record.prefill_ms = _figure(reply.timings, "prefill_ms")
        record.node_ttft_ms = _figure(reply.timings, "ttft_ms")
        record.decode_tps = _figure(reply.timings, "decode_tokens_per_s") or None
        record.hit = record.turn > 0 and prompt_before > 0 and record.cached >= prompt_before / 2
        calls = [reply.calls[i] for i in sorted(reply.calls)]
        record.tool_called = bool(calls)
        if calls or record.tool_req:
            record.tool_valid = bool(calls) and all(tool_call_valid(c) for c in calls)

    # --- live figures ---------------------------------------------------------------------------

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                await self.tick(await self.live())
            except asyncio.CancelledError:
                raise
            except Exception:  # a missed tick is not the run's failure
                continue

    async def live(self) -> dict[str, Any]:
        """The live figures: step, concurrency, open sessions, requests sent and answered
        (finished, failed included), requests/s, TTFT P50/P95 and
        turn latency P95 over the last ``WINDOW_S``, session P95 so far, errors by kind,
        tool-call validity, the array's nodes and the control plane's probe latencies (ms)."""
        now = self.now()
        recent = [t for t in self.turns if t.t + t.lat >= now - WINDOW_S]
        ok = [t for t in recent if t.ok]
        sessions = [s for s in self.step_sessions if s["complete"]]
        required = [t for t in self.turns if t.ok and t.tool_req]
        health, console, nodes = await asyncio.gather(
            self._probe("/health"), self._probe_console(), self._nodes()
        )
        return {
            "t": round(now, 2),
            "step": self.step_index,
            "steps": len(self.scenario.steps),
            "concurrency": self.scenario.steps[self.step_index],
            "open_sessions": self.open_sessions,
            "requests": self.requests,
            "answered": self.answered_before + len(self.turns),
            "requests_per_s": round(len(ok) / min(WINDOW_S, max(now, 1e-9)), 3),
            "tokens_per_s": round(sum(t.completion for t in ok) / min(WINDOW_S, max(now, 1e-9)), 2),
            "ttft_p50_s": analysis.rounded(analysis.percentile((t.ttft for t in ok), 50)),
            "ttft_p95_s": analysis.rounded(analysis.percentile((t.ttft for t in ok), 95)),
            "turn_p50_s": analysis.rounded(analysis.percentile((t.lat for t in ok), 50)),
            "turn_p95_s": analysis.rounded(analysis.percentile((t.lat for t in ok), 95)),
            "session_p95_s": analysis.rounded(
                analysis.percentile((s["dur"] for s in sessions), 95)
            ),
            "errors": dict(Counter(t.error for t in self.turns if not t.ok)),
            "tool_validity": analysis.rounded(
                sum(1 for t in required if t.tool_valid) / len(required)
            )
            if required
            else None,
            "nodes": nodes,
            "health_ms": health,
            "console_ms": console,
        }

    async def _probe(self, path: str) -> float | None:
        """Milliseconds ``GET path`` on the target took; None when it failed or timed out."""
        started = time.monotonic()
        try:
            response = await self.http.get(
                f"{self.target.url.rstrip('/')}{path}",
                headers={"Authorization": f"Bearer {self.target.token}"},
            )
        except httpx.HTTPError:
            return None
        if response.status_code in (401, 403, 404) and path != "/health":
            self.console_supported = False
        if response.status_code >= 500:
            return None
        return round((time.monotonic() - started) * 1000, 2)

    async def _probe_console(self) -> float | None:
        """The console's API (``/api/nodes``, through Django's whole stack) when the target
        has one."""
        return await self._probe("/api/nodes") if self.console_supported else None

    async def _nodes(self) -> dict[str, Any]:
        if self.sample_array is None:
            return {}
        try:
            snapshot = await self.sample_array()
        except Exception:
            return {}
        keep = analysis.NODE_FIGURES
        return {
            node_id: {k: n.get(k) for k in keep}
            for node_id, n in (snapshot.get("nodes") or {}).items()
        }
