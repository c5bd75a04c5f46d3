"""Synthetic load-test records (the shapes of ``inference.loadtests.analysis``) for unit tests."""

from __future__ import annotations

from typing import Any

# every report has each of these sections (inference.loadtests.report)
REPORT_SECTIONS = frozenset(
    (
        "scenario summary steps curve ttft_split tool_calls nodes errors control_plane capacity "
        "capacity_tightest targets findings profiles"
    ).split()
)


def turn(
    step: int,
    c: int,
    *,
    sid: str = "s",
    turn: int = 1,
    ttft: float = 0.1,
    lat: float = 0.5,
    ok: bool = True,
    error: str = "",
    node: str = "node-01",
    prompt: int = 400,
    cached: int = 380,
    completion: int = 20,
    queue_ms: float = 2.0,
    prefill_ms: float = 40.0,
    hit: bool = True,
    tool_req: bool = False,
    tool_called: bool = False,
    tool_valid: bool | None = None,
    t: float = 0.0,
    message: str = "",
    node_ttft_ms: float | None = None,
    decode_tps: float | None = None,
    finish: str = "stop",
) -> dict[str, Any]:
    return {
        "step": step,
        "c": c,
        "sid": sid,
        "turn": turn,
        "kind": "user",
        "t": t,
        "ttft": ttft,
        "lat": lat,
        "ok": ok,
        "error": error,
        "message": message,
        "node": node,
        "prompt": prompt,
        "cached": cached,
        "completion": completion,
        "queue_ms": queue_ms,
        "prefill_ms": prefill_ms,
        "hit": hit,
        "tool_req": tool_req,
        "tool_called": tool_called,
        "tool_valid": tool_valid,
        "node_ttft_ms": node_ttft_ms,
        "decode_tps": decode_tps,
        "finish": finish,
    }


def curve(
    points: list[tuple[int, float, float]], *, turns_per_step: int = 20, duration_s: float = 10.0
) -> tuple[list[dict], list[dict], list[dict]]:
    """``(turns, sessions, steps)`` of a run whose step ``i`` has concurrency ``c``, every
    turn's TTFT ``ttft`` and ``tokens_per_s`` completion tokens a second over the step."""
    turns, sessions, steps = [], [], []
    for i, (c, ttft, tokens_per_s) in enumerate(points):
        per_turn = tokens_per_s * duration_s / turns_per_step
        for k in range(turns_per_step):
            turns.append(
                turn(
                    i,
                    c,
                    sid=f"s{i}-{k % c}",
                    ttft=ttft,
                    lat=ttft + 0.4,
                    completion=round(per_turn),
                    t=i * duration_s + k * 0.1,
                )
            )
        for j in range(c):
            sessions.append(
                {
                    "step": i,
                    "c": c,
                    "sid": f"s{i}-{j}",
                    "t": i * duration_s,
                    "dur": 2.0 + ttft * 4,
                    "turns": 4,
                    "complete": True,
                    "nodes": ["node-01"],
                }
            )
        steps.append({"step": i, "c": c, "started": i * duration_s, "ended": (i + 1) * duration_s})
    return turns, sessions, steps
