"""Running the tool-call evaluation against a real node agent serving a GGUF package.

``evaluate_package`` starts a node on loopback (``start_eval_node``: ``manage.py runnode`` with a
fresh credential), smoke-tests it (``smoke_test``: a streamed tool call with an emoji, then a
streamed answer to its result), runs the suite's cases in both modes (``run_cases``), probes its
speed (``speed_probe``), stops it and measures the perplexity of the bundled text.

The two modes send the same prompt text. ``grammar``: the request carries ``tools`` and
``tool_choice: "auto"``; the node describes the tools in the system message and constrains the
output with the tools' grammar. ``free``: no ``tools``; the same description
(``inference.engine.prompt.tools_system_block``) is written into the system message here, and
the call is parsed from the content (``scoring.read_answer``): what the model does unconstrained.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from inference.engine.prompt import tools_system_block
from inference.packages.evaluation.scoring import (
    MODES,
    Answer,
    CaseScore,
    read_answer,
    score_case,
    summarize,
)
from inference.packages.evaluation.suite import Case, Suite, load_suite

REPO_ROOT = Path(__file__).resolve().parents[3]  # the directory holding manage.py
START_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 15.0
LOG_TAIL_CHARS = 4000
ANSWER_CHARS = 300
PERPLEXITY_CTX = 512

ProgressFn = Callable[[float, str], None]


class NodeStartFailed(RuntimeError):
    """The evaluation node exited, or was not healthy within ``START_TIMEOUT_S`` (a GGUF that
    does not load, a chat template that does not parse ...). ``log_tail``: the end of its log."""

    def __init__(self, message: str, log_tail: str) -> None:
        super().__init__(f"{message}\n{log_tail}" if log_tail else message)
        self.log_tail = log_tail


class EvaluationError(RuntimeError):
    """The node could not be reached, or broke a request, in the middle of an evaluation."""


# The node ------------------------------------------------------------------------------------


@dataclass
class EvalNode:
    """A node agent started by ``start_eval_node``; a context manager that stops it on exit.
    ``url``: ``http://127.0.0.1:<port>``; ``headers``: its ``Authorization``."""

    process: subprocess.Popen[bytes]
    url: str
    credential: str
    log_path: Path
    package: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.credential}"}

    def client(self, timeout: float = REQUEST_TIMEOUT_S) -> httpx.Client:
        """An ``httpx.Client`` on the node's URL with its credential."""
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        """The last ``chars`` characters of the node's log."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``; waits for the process to end."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> EvalNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_eval_node(
    gguf_path: Path | str,
    *,
    log_path: Path | str,
    threads: int = 1,
    sequences: int = 4,
    ctx_per_seq: int = 2048,
    package_name: str = "eval",
) -> EvalNode:
    """Start ``manage.py runnode`` serving ``gguf_path`` as ``package_name`` on a free loopback
    port, accepting a fresh random credential, its output in ``log_path``; return once
    ``GET /health`` answers 200. Raises ``NodeStartFailed`` (the node is stopped) when the
    process exits, reports a load error, or is not healthy within ``START_TIMEOUT_S``."""
    from nodes.agent.auth import ENV_CREDENTIAL

    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    credential = secrets.token_urlsafe(32)
    args = [
        sys.executable,
        "manage.py",
        "runnode",
        "--id",
        f"eval-{secrets.token_hex(3)}",
        "--listen",
        f"127.0.0.1:{port}",
        "--model",
        str(gguf_path),
        "--package",
        package_name,
        "--sequences",
        str(sequences),
        "--ctx-per-seq",
        str(ctx_per_seq),
        "--threads",
        str(threads),
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            args,
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, ENV_CREDENTIAL: credential},
            start_new_session=True,
        )
    node = EvalNode(process, f"http://127.0.0.1:{port}", credential, log_path, package_name)
    try:
        _wait_healthy(node)
    except BaseException:
        node.stop()
        raise
    return node


def _wait_healthy(node: EvalNode) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if node.process.poll() is not None:
            raise NodeStartFailed(
                f"the node exited with status {node.process.returncode}", node.log_tail()
            )
        try:
            health = httpx.get(f"{node.url}/health", timeout=2.0)
        except httpx.HTTPError:
            health = None
        if health is not None and health.status_code == 200:
            return
        if health is not None and health.status_code == 500:  # the engine failed to load
            error = health.json().get("error", "") if _is_json(health) else health.text
            raise NodeStartFailed(f"the node could not load the model: {error}", node.log_tail())
        time.sleep(0.25)
    raise NodeStartFailed(
        f"the node was not healthy after {START_TIMEOUT_S:.0f} s", node.log_tail()
    )


def _is_json(response: httpx.Response) -> bool:
    return response.headers.get("content-type", "").startswith("application/json")


# Streams -------------------------------------------------------------------------------------


@dataclass
class StreamResult:
    """What a streamed chat completion delivered. ``error``: the node's message (an HTTP
    error, an in-band error event, a broken stream), "" when none; ``tool_calls``: OpenAI
    ``tool_calls`` assembled from the deltas; times are ``time.perf_counter()`` seconds."""

    status: int = 0
    chunks: int = 0
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    error: str = ""
    sent_at: float = 0.0
    first_content_at: float | None = None
    last_content_at: float | None = None


def http_error(response: httpx.Response) -> str:
    """``HTTP <status> <code>: <message>`` from an OpenAI-shaped error body (or the raw body)."""
    try:
        error = response.json().get("error") or {}
        return f"HTTP {response.status_code} {error.get('code')}: {error.get('message')}"
    except (ValueError, AttributeError):
        return f"HTTP {response.status_code}: {response.text[:500]}"


def stream_chat(client: httpx.Client, body: dict[str, Any]) -> StreamResult:
    """POST ``body`` with ``stream: true`` and read its server-sent events to ``[DONE]``.
    Never raises for the node's failures: they are in ``StreamResult.error``."""
    result = StreamResult(sent_at=time.perf_counter())
    calls: dict[int, dict[str, Any]] = {}
    try:
        with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            result.status = r.status_code
            if r.status_code != 200:
                r.read()
                result.error = http_error(r)
                return result
            done = False
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    error = chunk["error"]
                    result.error = f"error event {error.get('code')}: {error.get('message')}"
                    return result
                result.chunks += 1
                _take_chunk(result, chunk, calls)
            if not done:
                result.error = "the stream ended without [DONE]"
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        result.error = f"broken stream: {type(exc).__name__}: {exc}"
    result.tool_calls = [calls[i] for i in sorted(calls)]
    return result


def _take_chunk(result: StreamResult, chunk: dict[str, Any], calls: dict[int, dict]) -> None:
    if chunk.get("usage"):
        result.usage = chunk["usage"]
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content"):
            now = time.perf_counter()
            result.first_content_at = result.first_content_at or now
            result.last_content_at = now
            result.content += delta["content"]
        for part in delta.get("tool_calls") or []:
            call = calls.setdefault(
                part.get("index", 0),
                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
            )
            call["id"] = part.get("id") or call["id"]
            function = part.get("function") or {}
            call["function"]["name"] += function.get("name") or ""
            call["function"]["arguments"] += function.get("arguments") or ""
        if choice.get("finish_reason"):
            result.finish_reason = choice["finish_reason"]


# Smoke test ----------------------------------------------------------------------------------

SMOKE_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
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
SMOKE_USER = "What is the weather in Lisbon today, in celsius? ☀️🌧️"
SMOKE_RESULT = '{"temperature": 21, "unit": "celsius", "conditions": "sunny ☀️"}'


@dataclass
class SmokeResult:
    """``passed``: every step passed; ``error``: the first failure (the node's message);
    ``steps``: ``{"name", "ok", "detail"}`` for each step run."""

    passed: bool
    error: str
    steps: list[dict[str, Any]]

    def as_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "error": self.error, "steps": self.steps}


def smoke_test(client: httpx.Client) -> SmokeResult:
    """Two streamed turns through the node's chat template: 1) ``tool_call``: a user message
    with emoji, a tool and ``tool_choice: "required"``, which must stream chunks and end with a
    tool call whose arguments parse as a JSON object; 2) ``tool_result``: that call and a
    tool result appended (``tool_choice: "none"``), which must finish with some content. An
    HTTP error (a template that fails to render is a 400 ``template_error``), an error event
    or a broken stream fails the test with the node's message in ``error``."""
    steps: list[dict[str, Any]] = []

    def fail(name: str, error: str) -> SmokeResult:
        steps.append({"name": name, "ok": False, "detail": error})
        return SmokeResult(False, f"{name}: {error}", steps)

    messages: list[dict[str, Any]] = [{"role": "user", "content": SMOKE_USER}]
    base = {"tools": [SMOKE_TOOL], "temperature": 0, "max_tokens": 96}
    first = stream_chat(client, {**base, "messages": messages, "tool_choice": "required"})
    if first.error:
        return fail("tool_call", first.error)
    if first.chunks < 2 or not first.tool_calls or first.finish_reason != "tool_calls":
        return fail(
            "tool_call",
            f"expected a streamed tool call, got {first.chunks} chunks, finish_reason "
            f"{first.finish_reason!r}, content {first.content[:200]!r}",
        )
    call = first.tool_calls[0]
    try:
        arguments = json.loads(call["function"]["arguments"])
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        return fail("tool_call", f"arguments do not parse: {call['function']['arguments'][:200]!r}")
    steps.append(
        {
            "name": "tool_call",
            "ok": True,
            "detail": f"{call['function']['name']}({json.dumps(arguments, ensure_ascii=False)})",
        }
    )
    call_id = call["id"] or "call_smoke"
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [{**call, "id": call_id}]},
        {"role": "tool", "tool_call_id": call_id, "content": SMOKE_RESULT},
    ]
    second = stream_chat(client, {**base, "messages": messages, "tool_choice": "none"})
    if second.error:
        return fail("tool_result", second.error)
    if not second.content.strip() or second.finish_reason not in ("stop", "length"):
        return fail(
            "tool_result",
            f"expected an answer, got finish_reason {second.finish_reason!r}, content "
            f"{second.content[:200]!r}",
        )
    steps.append({"name": "tool_result", "ok": True, "detail": second.content[:200]})
    return SmokeResult(True, "", steps)


# Cases ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaseOutcome:
    """One case run in one mode: its score, the answer read, and the node's error when it
    refused the request (the case then counts as wrong)."""

    case_id: str
    category: str
    mode: str
    score: CaseScore
    answer: Answer
    error: str = ""

    def row(self) -> dict[str, Any]:
        """The report's row: ``id, mode, correct, called, parsed, schema_valid, name_ok,
        args_ok, answer`` (its first 300 characters; the node's error when it refused)."""
        s = self.score
        return {
            "id": self.case_id,
            "mode": self.mode,
            "correct": s.correct,
            "called": s.called,
            "parsed": s.parsed,
            "schema_valid": s.schema_valid,
            "name_ok": s.name_ok,
            "args_ok": s.args_ok,
            "answer": (self.error or self.answer.text)[:ANSWER_CHARS],
        }


def messages_with_tools_block(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``messages`` with the tools described in the system message exactly as a node does
    it for a request with ``tools`` (``tools_system_block`` after the first system message and
    a blank line, or as a new first system message)."""
    block = tools_system_block(tools)
    rest = list(messages)
    if rest and rest[0]["role"] in ("system", "developer"):
        content = rest[0].get("content") or ""
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        return [{"role": "system", "content": content + "\n\n" + block}, *rest[1:]]
    return [{"role": "system", "content": block}, *rest]


def case_request(suite: Suite, case: Case, *, mode: str, max_tokens: int) -> dict[str, Any]:
    """The chat-completion body for ``case`` in ``mode`` ("grammar" or "free"): greedy,
    non-streamed."""
    tools = suite.tools_for(case)
    body: dict[str, Any] = {"temperature": 0, "max_tokens": max_tokens, "stream": False}
    if mode == "grammar":
        return {**body, "messages": case.messages, "tools": tools, "tool_choice": "auto"}
    if mode == "free":
        return {**body, "messages": messages_with_tools_block(case.messages, tools)}
    raise ValueError(f"unknown mode {mode!r} (one of {', '.join(MODES)})")


def run_case(
    client: httpx.Client, suite: Suite, case: Case, *, mode: str, max_tokens: int = 192
) -> CaseOutcome:
    """Run one case and score it. A 4xx/5xx answer is a wrong outcome carrying the node's
    message; ``EvaluationError`` when the node cannot be reached."""
    body = case_request(suite, case, mode=mode, max_tokens=max_tokens)
    try:
        response = client.post("/v1/chat/completions", json=body)
    except httpx.HTTPError as exc:
        raise EvaluationError(f"case {case.id} ({mode}): {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        expects = case.expected_call is not None
        refused = CaseScore(
            expects, False, False, None, None, *((False, False) if expects else (None, None))
        )
        return CaseOutcome(
            case.id,
            case.category,
            mode,
            refused,
            Answer(False, None, None, False, ""),
            http_error(response),
        )
    answer = read_answer(response.json()["choices"][0]["message"])
    score = score_case(
        case.expected_call,
        answer,
        offered=suite.schemas_for(case),
        optional_args=case.optional_args,
    )
    return CaseOutcome(case.id, case.category, mode, score, answer)


def run_cases(
    client: httpx.Client,
    cases: Suite,
    *,
    mode: str,
    concurrency: int = 4,
    max_tokens: int = 192,
    progress: Callable[[int, int], None] | None = None,
) -> list[CaseOutcome]:
    """Run every case of the (sub)suite ``cases`` in ``mode``, ``concurrency`` requests at a
    time (greedy, non-streamed, at most ``max_tokens`` each); outcomes in the suite's order.
    ``progress(done, total)`` after each case. Raises ``EvaluationError`` (``run_case``)."""
    total = len(cases.cases)
    done = 0
    outcomes: dict[str, CaseOutcome] = {}
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = [
            pool.submit(run_case, client, cases, case, mode=mode, max_tokens=max_tokens)
            for case in cases.cases
        ]
        for future in as_completed(futures):
            outcome = future.result()
            outcomes[outcome.case_id] = outcome
            done += 1
            if progress:
                progress(done, total)
    return [outcomes[case.id] for case in cases.cases]


# Speed ---------------------------------------------------------------------------------------

SPEED_PROMPTS = (
    "Write a short paragraph about a lighthouse keeper who finds a message in a bottle.",
    "Describe, in a few sentences, how a bicycle works.",
    "Tell a short story about a cat that learns to swim.",
    "Explain in a paragraph why the sky looks blue during the day.",
    "Write a few sentences about a busy morning at a train station.",
)


def speed_probe(
    client: httpx.Client, *, requests: int = 3, max_tokens: int = 64
) -> dict[str, float | None]:
    """Median time to first token and decode speed over ``requests`` streamed requests, one
    at a time, each with a different prompt (no reused KV beyond the template's prefix).
    ``{"ttft_ms": ms from sending to the first content chunk, "decode_tok_s": (completion
    tokens - 1) / seconds from the first to the last content chunk}`` (completion tokens from
    the final ``usage``); a figure is None when no request gave it. Raises
    ``EvaluationError`` when a request fails."""
    ttfts: list[float] = []
    rates: list[float] = []
    for i in range(requests):
        prompt = SPEED_PROMPTS[i % len(SPEED_PROMPTS)]
        result = stream_chat(
            client,
            {
                "messages": [{"role": "user", "content": prompt}],
                "temperature": 0,
                "max_tokens": max_tokens,
                "stream_options": {"include_usage": True},
            },
        )
        if result.error:
            raise EvaluationError(f"speed probe: {result.error}")
        if result.first_content_at is None:
            continue
        ttfts.append((result.first_content_at - result.sent_at) * 1000)
        tokens = (result.usage or {}).get("completion_tokens", 0)
        span = (result.last_content_at or result.first_content_at) - result.first_content_at
        if tokens > 1 and span > 0:
            rates.append((tokens - 1) / span)
    return {
        "ttft_ms": statistics.median(ttfts) if ttfts else None,
        "decode_tok_s": statistics.median(rates) if rates else None,
    }


# The whole evaluation ------------------------------------------------------------------------


def _report(suite: Suite) -> dict[str, Any]:
    return {
        "suite": {"version": suite.version, "cases": len(suite.cases)},
        "smoke": {"passed": False, "error": "", "steps": []},
        "modes": {},
        "speed": None,
        "perplexity": None,
        "perplexity_tokens": 0,
        "cases": [],
        "seconds": 0.0,
    }


# Progress: the share of the whole evaluation done when each stage starts.
_STAGES = {
    "start": 0.0,
    "smoke": 0.05,
    "grammar": 0.08,
    "free": 0.46,
    "speed": 0.84,
    "perplexity": 0.9,
}


def evaluate_package(
    gguf_path: Path | str,
    *,
    workdir: Path | str,
    subset: int | None = None,
    threads: int = 1,
    progress: ProgressFn | None = None,
    measure_perplexity: bool = True,
) -> dict[str, Any]:
    """Evaluate the GGUF at ``gguf_path``: start a node on it (log: ``workdir/eval-node.log``),
    smoke-test it, run the suite (or ``Suite.subset(subset)``) in both modes, probe its speed,
    stop it, then measure the perplexity of the bundled text (``n_ctx`` 512, ``threads``).
    ``progress(fraction 0..1, what)`` as it goes.

    Returns a JSON-able report: ``{"suite": {"version", "cases"}, "smoke": {"passed", "error",
    "steps"}, "modes": {"grammar": summary, "free": summary} (``scoring.summarize``), "speed":
    {"ttft_ms", "decode_tok_s"}, "perplexity": float | None, "perplexity_tokens": n, "cases":
    [CaseOutcome.row() ...], "seconds": wall time}``. When the node does not start (the error
    and its log tail in ``smoke.error``, one step ``start``) or the smoke test fails, nothing
    else is run: ``modes`` {}, ``speed`` None, ``perplexity`` None, ``cases`` [].

    Raises ``EvaluationError`` when the node dies during the run, and what
    ``inference.engine.perplexity.perplexity`` raises."""
    started = time.monotonic()
    workdir = Path(workdir)
    suite = load_suite().subset(subset)
    report = _report(suite)

    def note(stage: str, share: float = 0.0, what: str = "") -> None:
        if progress:
            stages = list(_STAGES)
            nxt = _STAGES[stages[stages.index(stage) + 1]] if stage != stages[-1] else 1.0
            progress(_STAGES[stage] + share * (nxt - _STAGES[stage]), what or stage)

    def finished() -> dict[str, Any]:
        report["seconds"] = round(time.monotonic() - started, 3)
        if progress:
            progress(1.0, "done")
        return report

    note("start", what="starting the node")
    try:
        node = start_eval_node(gguf_path, log_path=workdir / "eval-node.log", threads=threads)
    except NodeStartFailed as exc:
        report["smoke"] = {
            "passed": False,
            "error": str(exc),
            "steps": [{"name": "start", "ok": False, "detail": exc.log_tail}],
        }
        return finished()
    with node, node.client() as client:
        note("smoke", what="smoke test")
        smoke = smoke_test(client)
        report["smoke"] = smoke.as_dict()
        if not smoke.passed:
            return finished()
        for mode in MODES:

            def step(done: int, total: int, mode: str = mode) -> None:
                note(mode, done / total, f"{mode}: {done}/{total} cases")

            outcomes = run_cases(client, suite, mode=mode, progress=step)
            report["modes"][mode] = summarize([o.score for o in outcomes])
            report["cases"] += [o.row() for o in outcomes]
        note("speed", what="speed probe")
        report["speed"] = speed_probe(client)
    if measure_perplexity:
        from inference.engine.perplexity import perplexity

        note("perplexity", what="perplexity")
        result = perplexity(
            gguf_path, suite.text_for_perplexity, n_ctx=PERPLEXITY_CTX, threads=threads
        )
        report["perplexity"] = result.perplexity
        report["perplexity_tokens"] = result.tokens
    return finished()
