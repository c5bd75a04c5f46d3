"""Running the tool-call evaluation against a real node agent serving a GGUF package.

``evaluate_package`` starts a node on loopback (``start_eval_node``: ``manage.py runnode`` with a
fresh credential), smoke-tests it (``smoke_test``: a streamed tool call with an emoji, then a
streamed answer to its result), runs the suite's cases in both modes (``run_cases``), probes its
speed (``speed_probe``), stops it and measures the perplexity of the bundled text.

The node is in ``node.py``, the streamed requests in ``stream.py``, the smoke test in
``smoke.py``.

The two modes send the same prompt text. ``grammar``: the request carries ``tools`` and
``tool_choice: "auto"``; the node describes the tools in the system message and constrains the
output with the tools' grammar. ``free``: no ``tools``; the same description
(``inference.engine.prompt.tools_system_block``) is written into the system message here, and
the call is parsed from the content (``scoring.read_answer``): what the model does unconstrained.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from inference.engine.prompt import TOOL_OPEN, tools_system_block
from inference.packages.evaluation.node import NodeStartFailed, start_eval_node
from inference.packages.evaluation.scoring import (
    MODES,
    Answer,
    CaseScore,
    read_answer,
    refused_score,
    score_case,
    summarize,
)
from inference.packages.evaluation.smoke import smoke_test
from inference.packages.evaluation.stream import stream_chat
from inference.packages.evaluation.suite import Case, Suite, load_suite

ANSWER_CHARS = 300
PERPLEXITY_CTX = 512
SESSION_HEADER = "x-session-id"

ProgressFn = Callable[[float, str], None]


class EvaluationError(RuntimeError):
    """The node could not be reached, or broke a request, in the middle of an evaluation."""


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
    """The chat-completion body for ``case`` in ``mode`` ("grammar" or "free"): greedy, at
    most ``max_tokens``."""
    tools = suite.tools_for(case)
    body: dict[str, Any] = {"temperature": 0, "max_tokens": max_tokens}
    if mode == "grammar":
        return {**body, "messages": case.messages, "tools": tools, "tool_choice": "auto"}
    if mode == "free":
        return {**body, "messages": messages_with_tools_block(case.messages, tools)}
    raise ValueError(f"unknown mode {mode!r} (one of {', '.join(MODES)})")


def answer_decided(content: str, tool_calls: Sequence[dict[str, Any]] = ()) -> bool:
    """True once a streamed answer is known to be text and ``ANSWER_CHARS`` of it are in:
    it does not open with ``<tool_call>`` (``scoring.read_call_text``), so the rest cannot
    change its score, and the report shows no more of it. A call is read to its end."""
    opened = content.lstrip()
    if tool_calls or not opened or TOOL_OPEN.startswith(opened[: len(TOOL_OPEN)]):
        return False
    return len(content) >= ANSWER_CHARS


def run_case(
    client: httpx.Client, suite: Suite, case: Case, *, mode: str, max_tokens: int = 192
) -> CaseOutcome:
    """Run one case (streamed, read until ``answer_decided``) and score it. A refusal (4xx /
    5xx, an error event) is a wrong outcome carrying the node's message; raises
    ``EvaluationError`` when the node cannot be reached or breaks the stream."""
    body = case_request(suite, case, mode=mode, max_tokens=max_tokens)
    result = stream_chat(
        client,
        body,
        until=lambda r: answer_decided(r.content, r.tool_calls),
        headers={SESSION_HEADER: f"eval-{case.id}"},
    )
    if result.broken:
        raise EvaluationError(f"case {case.id} ({mode}): {result.error}")
    if result.error:
        refused = refused_score(case.expected_call is not None)
        empty = Answer(False, None, None, False, "")
        return CaseOutcome(case.id, case.category, mode, refused, empty, result.error)
    message = {"role": "assistant", "content": result.content, "tool_calls": result.tool_calls}
    answer = read_answer(message)
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
    concurrency: int = 1,
    max_tokens: int = 192,
    progress: Callable[[int, int], None] | None = None,
) -> list[CaseOutcome]:
    """Run every case of the (sub)suite ``cases`` in ``mode``, ``concurrency`` requests at a
    time (greedy, at most ``max_tokens`` each, streamed and read only until the answer is
    decided: ``run_case``); outcomes in the suite's order. ``progress(done, total)`` after each
    case. Raises ``EvaluationError`` (``run_case``).

    One at a time by default: greedy outputs then repeat exactly from run to run. Batched with
    other requests they do not (llama.cpp's sums run in another order when a step carries
    several sequences): with 4 at a time, 9 of 18 answers of SmolLM2-135M changed between two
    identical runs of 9 cases, one of them from a call to text, for a run only about 20 %
    shorter. Each case keeps its KV under session ``eval-<case id>``, so the second mode,
    whose prompt is byte-identical, does not prefill it again."""
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


# Progress: the share of the whole evaluation done when each stage starts. The grammar mode
# prefills every prompt; the free mode reuses that KV (SmolLM2-135M on one thread: 4.8 s and
# 0.9 s a case).
_STAGES = {
    "start": 0.0,
    "smoke": 0.04,
    "grammar": 0.06,
    "free": 0.78,
    "speed": 0.9,
    "perplexity": 0.93,
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
    note = _stage_notes(progress)
    note("start", what="starting the node")
    try:
        node = start_eval_node(gguf_path, log_path=workdir / "eval-node.log", threads=threads)
    except NodeStartFailed as exc:
        report["smoke"] = {
            "passed": False,
            "error": str(exc),
            "steps": [{"name": "start", "ok": False, "detail": exc.log_tail}],
        }
        return _finished(report, started, progress)
    with node, node.client() as client:
        if not _evaluate_on_node(client, suite, report, note):
            return _finished(report, started, progress)
    if measure_perplexity:
        _measure_perplexity(gguf_path, suite, report, note, threads=threads)
    return _finished(report, started, progress)


StageNote = Callable[..., None]


def _stage_notes(progress: ProgressFn | None) -> StageNote:
    """``note(stage, share=0.0, what="")``: ``progress`` at ``share`` (0..1) of ``stage``'s
    part of the whole evaluation (``_STAGES``), saying ``what`` (the stage's name by
    default); nothing without ``progress``."""

    def note(stage: str, share: float = 0.0, what: str = "") -> None:
        if progress:
            stages = list(_STAGES)
            nxt = _STAGES[stages[stages.index(stage) + 1]] if stage != stages[-1] else 1.0
            progress(_STAGES[stage] + share * (nxt - _STAGES[stage]), what or stage)

    return note


def _finished(
    report: dict[str, Any], started: float, progress: ProgressFn | None
) -> dict[str, Any]:
    """``report`` with its wall time since ``started``; ``progress(1.0, "done")``."""
    report["seconds"] = round(time.monotonic() - started, 3)
    if progress:
        progress(1.0, "done")
    return report


def _evaluate_on_node(
    client: httpx.Client, suite: Suite, report: dict[str, Any], note: StageNote
) -> bool:
    """The smoke test, then (when it passed) the suite in both modes and the speed probe,
    into ``report``. False when the smoke test failed (nothing else is run)."""
    note("smoke", what="smoke test")
    smoke = smoke_test(client)
    report["smoke"] = smoke.as_dict()
    if not smoke.passed:
        return False
    for mode in MODES:

        def step(done: int, total: int, mode: str = mode) -> None:
            note(mode, done / total, f"{mode}: {done}/{total} cases")

        outcomes = run_cases(client, suite, mode=mode, progress=step)
        report["modes"][mode] = summarize([o.score for o in outcomes])
        report["cases"] += [o.row() for o in outcomes]
    note("speed", what="speed probe")
    report["speed"] = speed_probe(client)
    return True


def _measure_perplexity(
    gguf_path: Path | str,
    suite: Suite,
    report: dict[str, Any],
    note: StageNote,
    *,
    threads: int,
) -> None:
    """The perplexity of the suite's bundled text (``n_ctx`` ``PERPLEXITY_CTX``) into
    ``report``."""
    from inference.engine.perplexity import perplexity

    note("perplexity", what="perplexity")
    result = perplexity(gguf_path, suite.text_for_perplexity, n_ctx=PERPLEXITY_CTX, threads=threads)
    report["perplexity"] = result.perplexity
    report["perplexity_tokens"] = result.tokens
