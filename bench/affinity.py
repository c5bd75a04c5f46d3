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
mean turn latency / pinned mean turn latency (goal: >= 2); ``ttft_ratio`` is the same for the
mean time to first token, the part of a turn routing changes (decode costs the same wherever the
turn runs).

Fair to the peers: each mode gets three freshly started nodes (no mode inherits another's
sequences, host-RAM copies or cached prefixes), the modes run in a random order (``--seed``,
printed), ``--quick`` only shortens the run (fewer sessions and turns, the same ``max_tokens``),
and a ratio is only reported between modes whose success rates are equal (``null`` otherwise,
with the rates printed).

    python bench/affinity.py [--quick] [--seed N]
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


MAX_TOKENS = 40


def run_mode(mode: str, log_dir: Path, sessions: int, turns: int, rng: random.Random) -> dict:
    """``mode`` on three nodes started for it (and a control plane for ``pinned``), then stopped."""
    mode_dir = log_dir / mode
    mode_dir.mkdir()
    nodes, plane = [], None
    try:
        nodes = [start_node(f"node-0{i}", mode_dir, extra_args=NODE_ARGS) for i in (1, 2, 3)]
        direct = [(p.url, p.headers) for p in nodes]
        if mode == "pinned":
            addresses = {p.log_path.stem: p.url.removeprefix("http://") for p in nodes}
            plane = ControlPlane(
                addresses, mode_dir, policy={"health_interval_s": 1.0, "canary_idle_s": 0}
            )
            pickers = lambda s: lambda: (plane.url, plane.headers)  # noqa: E731
        elif mode == "round_robin":
            rr = itertools.cycle(direct)
            pickers = lambda s: lambda: next(rr)  # noqa: E731
        else:
            pickers = lambda s: lambda: rng.choice(direct)  # noqa: E731
        return asyncio.run(measure(mode, pickers, sessions, turns, MAX_TOKENS))
    finally:
        if plane is not None:
            plane.stop()
        for proc in nodes:
            proc.stop()


def ratio_over_pinned(results: dict, mode: str, figure: str = "mean_turn_s") -> float | None:
    """``results[mode][figure] / results['pinned'][figure]``; None when either mode is missing
    or their success rates differ (a mode that failed turns did less work)."""
    if mode not in results or "pinned" not in results:
        return None
    if results[mode]["success_rate"] != results["pinned"]["success_rate"]:
        return None
    return round(results[mode][figure] / max(1e-9, results["pinned"][figure]), 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="6 sessions x 3 turns a mode")
    parser.add_argument(
        "--modes",
        default="pinned,round_robin,random",
        help="comma-separated subset to run (the ratio needs pinned and round_robin)",
    )
    parser.add_argument("--seed", type=int, default=None, help="mode order and random picks")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 16)
    rng = random.Random(seed)
    modes = args.modes.split(",")
    rng.shuffle(modes)
    print(f"seed {seed}: modes in order {', '.join(modes)}")
    sessions, turns = (6, 3) if args.quick else (12, 8)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-affinity-"))
    results = {mode: run_mode(mode, log_dir, sessions, turns, rng) for mode in modes}
    for mode, r in results.items():
        print(
            f"{mode:12s} mean turn {r['mean_turn_s']} s, p95 {r['p95_turn_s']} s, "
            f"mean TTFT {r['mean_ttft_s']} s, success {r['success_rate']}"
        )
    emit(
        {
            "bench": "affinity",
            "quick": args.quick,
            "seed": seed,
            "order": modes,
            "nodes": 3,
            "sessions": sessions,
            "turns": turns,
            "max_tokens": MAX_TOKENS,
            **results,
            "ratio_vs_random": ratio_over_pinned(results, "random"),
            "ttft_ratio": ratio_over_pinned(results, "round_robin", "mean_ttft_s"),
            "ratio": ratio_over_pinned(results, "round_robin"),
        }
    )


if __name__ == "__main__":
    main()
