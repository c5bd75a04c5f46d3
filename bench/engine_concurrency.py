"""Aggregate decode tokens/s and TTFT P95 at 1, 4, 8 and 16 concurrent streams.

Phalanx's node against llama-cpp-python's own server (``python -m llama_cpp.server``), same
model (SmolLM2-135M-Instruct Q4_1), same threads, ``interrupt_requests`` off. The last line is a
JSON object; ``ratio`` is Phalanx's aggregate tokens/s over the peer's at 8 streams.

Fair to the peer: both servers run for the whole benchmark and are measured one at a time, the
side that goes first alternating from level to level (so drift on a busy machine does not land
on one side); each level's prompts open with their own tag (``[level 8, stream 3]``), so no
side reuses a prompt cached at an earlier level; each side is warmed up once, with a prompt no
level uses.

    python bench/engine_concurrency.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import httpx
from harness import emit, percentile, start_llama_cpp_server, start_node, stream_chat

TOPICS = [
    "dragons",
    "the sea",
    "a robot",
    "autumn",
    "a lighthouse",
    "trains",
    "bees",
    "a city at night",
    "mountains",
    "a lost key",
    "the moon",
    "coffee",
    "winter",
    "a library",
    "rain",
    "a garden",
]


def body(level: int, i: int, max_tokens: int) -> dict:
    """Stream ``i`` of concurrency ``level``: a prompt no other level or stream sends."""
    topic = TOPICS[i % len(TOPICS)]
    return {
        "model": "smollm2-135m-instruct-q4_1",
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "seed": i,
        "messages": [
            {
                "role": "user",
                "content": f"[level {level}, stream {i}] Write a long story about {topic}.",
            }
        ],
    }


async def warm_up(url: str, headers: dict) -> None:
    async with httpx.AsyncClient(timeout=300, headers=headers) as client:
        await stream_chat(client, url, body(0, 0, 4))


async def measure(url: str, streams: int, max_tokens: int, headers: dict) -> dict:
    async with httpx.AsyncClient(timeout=300, headers=headers) as client:
        start = time.perf_counter()
        results = await asyncio.gather(
            *(stream_chat(client, url, body(streams, i, max_tokens)) for i in range(streams))
        )
        wall = time.perf_counter() - start
    tokens = sum(r.tokens for r in results)
    return {
        "streams": streams,
        "tokens": tokens,
        "tokens_per_s": round(tokens / wall, 1),
        "ttft_p95_s": round(percentile([r.ttft_s for r in results], 95), 3),
    }


def bench(sides: dict, levels: list[int], max_tokens: int) -> dict[str, dict[int, dict]]:
    """Each level on every side, one side at a time; the first side alternates by level."""
    results: dict[str, dict[int, dict]] = {name: {} for name in sides}
    for proc in sides.values():
        asyncio.run(warm_up(proc.url, proc.headers))
    for k, n in enumerate(levels):
        order = list(sides) if k % 2 == 0 else list(reversed(sides))
        for name in order:
            proc = sides[name]
            results[name][n] = asyncio.run(measure(proc.url, n, max_tokens, proc.headers))
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--quick", action="store_true", help="1 and 8 streams, finishes within 60 s"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    levels = [1, 8] if args.quick else [1, 4, 8, 16]
    max_tokens = 48 if args.quick else args.tokens
    log_dir = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    sides = {}
    try:
        sides["peer"] = start_llama_cpp_server(log_dir, threads=args.threads, n_ctx=4096)
        sides["phalanx"] = start_node(
            "bench-node",
            log_dir,
            threads=args.threads,
            extra_args=["--sequences", "16", "--ctx-per-seq", "512"],
        )
        results = bench(sides, levels, max_tokens)
    finally:
        for proc in sides.values():
            proc.stop()
    ours, peer = results["phalanx"], results["peer"]
    for n in levels:
        print(
            f"{n:>2} streams  phalanx {ours[n]['tokens_per_s']:>7} tok/s  TTFT P95 {ours[n]['ttft_p95_s']:>6} s"
            f"   llama_cpp.server {peer[n]['tokens_per_s']:>7} tok/s  TTFT P95 {peer[n]['ttft_p95_s']:>6} s"
        )
    emit(
        {
            "bench": "engine_concurrency",
            "quick": args.quick,
            "threads": args.threads,
            "max_tokens": max_tokens,
            "phalanx": ours,
            "llama_cpp_server": peer,
            "ratio": round(ours[8]["tokens_per_s"] / peer[8]["tokens_per_s"], 2),
            "ratio_1_stream": round(ours[1]["tokens_per_s"] / peer[1]["tokens_per_s"], 2),
            "ttft_p95_ratio_8": round(ours[8]["ttft_p95_s"] / max(peer[8]["ttft_p95_s"], 1e-9), 3),
        }
    )


if __name__ == "__main__":
    main()
