"""Session-pinned routing against round-robin and random, on three nodes, in one run.

Twelve concurrent multi-turn agent sessions (the sessions of ``bench/multiturn.py``: a ~600-token
system prompt with tool schemas, then user messages and tool results, ~40 generated tokens a
turn). Three ways to spread them over the same three nodes:

- ``pinned``: through the Phalanx control plane (daphne + proxy + control loop), which places
  each session on the least-loaded node and keeps it there, so each turn prefills only its suffix;
- ``round_robin``: each turn to the next node in turn (a plain L4/L7 balancer);
- ``random``: each turn to a random node.

The peers call the nodes directly (no proxy hop), with the same ``X-Session-Id``, so a turn that
happens to land on the node that holds the session still reuses its KV. ``ratio`` = round-robin
mean turn latency / pinned mean turn latency (goal: >= 2), reported with equal success rates;
``ttft_ratio`` is the same for the mean time to first token, the part of a turn routing changes
(decode costs the same wherever the turn runs).

    python bench/affinity.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import tempfile
import time
from pathlib import Path

import httpx
from control_plane import ControlPlane
from harness import emit, percentile, start_node, stream_chat
from multiturn import SYSTEM, turn_message

NODE_ARGS = ["--sequences", "6", "--ctx-per-seq", "3072", "--host-ram-mib", "256"]


async def session(
    client, pick, sid: int, turns: int, max_tokens: int, mode: str, out: dict
) -> None:
    # Each mode opens its own system prompt, so no mode reuses KV left on the nodes by another
    # (the engine shares any cached prefix across sessions).
    messages = [{"role": "system", "content": f"[run: {mode}] {SYSTEM}"}]
    for turn in range(turns):
        messages.append(turn_message(sid, turn))
        url, headers = pick()
        body = {
            "model": "smollm2-135m-instruct-q4_1",
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0.7,
            "seed": sid * 100 + turn,
        }
        start = time.perf_counter()
        try:
            result = await stream_chat(
                client, url, body, headers={**headers, "X-Session-Id": f"{mode}-{sid}"}
            )
        except httpx.HTTPError:
            out["failed"] += 1
            messages.append({"role": "assistant", "content": "(failed)"})
            continue
        out["latencies"].append(time.perf_counter() - start)
        out["ttfts"].append(result.ttft_s)
        out["ok"] += 1
        messages.append({"role": "assistant", "content": result.text})


async def measure(mode: str, pickers, sessions: int, turns: int, max_tokens: int) -> dict:
    out: dict = {"latencies": [], "ttfts": [], "ok": 0, "failed": 0}
    async with httpx.AsyncClient(timeout=600) as client:
        start = time.perf_counter()
        await asyncio.gather(
            *(session(client, pickers(s), s, turns, max_tokens, mode, out) for s in range(sessions))
        )
        wall = time.perf_counter() - start
    lat = out["latencies"]
    return {
        "turns_ok": out["ok"],
        "turns_failed": out["failed"],
        "success_rate": round(out["ok"] / max(1, out["ok"] + out["failed"]), 3),
        "mean_turn_s": round(sum(lat) / max(1, len(lat)), 3),
        "p95_turn_s": round(percentile(lat, 95), 3),
        "mean_ttft_s": round(sum(out["ttfts"]) / max(1, len(out["ttfts"])), 3),
        "wall_s": round(wall, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="6 sessions x 3 turns, within 60 s")
    parser.add_argument(
        "--modes",
        default="pinned,round_robin,random",
        help="comma-separated subset to run (the ratio needs pinned and round_robin)",
    )
    args = parser.parse_args()
    modes = args.modes.split(",")
    sessions, turns, max_tokens = (6, 3, 8) if args.quick else (12, 8, 40)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-affinity-"))
    nodes = [start_node(f"node-0{i}", log_dir, extra_args=NODE_ARGS) for i in (1, 2, 3)]
    plane = None
    try:
        addresses = {p.log_path.stem: p.url.removeprefix("http://") for p in nodes}
        plane = ControlPlane(
            addresses, log_dir, policy={"health_interval_s": 1.0, "canary_idle_s": 0}
        )
        direct = [(p.url, p.headers) for p in nodes]
        rr = itertools.cycle(direct)
        rng = random.Random(7)
        pickers = {
            "pinned": lambda s: lambda: (plane.url, plane.headers),
            "round_robin": lambda s: lambda: next(rr),
            "random": lambda s: lambda: rng.choice(direct),
        }
        results = {
            mode: asyncio.run(measure(mode, pick, sessions, turns, max_tokens))
            for mode, pick in pickers.items()
            if mode in modes
        }
    finally:
        if plane is not None:
            plane.stop()
        for proc in nodes:
            proc.stop()
    for mode, r in results.items():
        print(
            f"{mode:12s} mean turn {r['mean_turn_s']} s, p95 {r['p95_turn_s']} s, "
            f"mean TTFT {r['mean_ttft_s']} s, success {r['success_rate']}"
        )

    def over_pinned(mode: str, figure: str = "mean_turn_s") -> float | None:
        if mode not in results or "pinned" not in results:
            return None
        return round(results[mode][figure] / max(1e-9, results["pinned"][figure]), 2)

    emit(
        {
            "bench": "affinity",
            "quick": args.quick,
            "nodes": 3,
            "sessions": sessions,
            "turns": turns,
            **results,
            "ratio_vs_random": over_pinned("random"),
            "ttft_ratio": over_pinned("round_robin", "mean_ttft_s"),
            "ratio": over_pinned("round_robin"),
        }
    )


if __name__ == "__main__":
    main()
