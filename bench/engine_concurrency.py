"""Aggregate decode tokens/s and TTFT P95 at 1, 4, 8 and 16 concurrent streams.

Phalanx's node against llama-cpp-python's own server (``python -m llama_cpp.server``), same
model (SmolLM2-135M-Instruct Q4_1), same threads, ``interrupt_requests`` off. The last line is a
JSON object; ``ratio`` is Phalanx's aggregate tokens/s over the peer's at 8 streams.

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


def body(i: int, max_tokens: int) -> dict:
    return {
        "model": "smollm2-135m-instruct-q4_1",
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "seed": i,
        "messages": [
            {"role": "user", "content": f"Write a long story about {TOPICS[i % len(TOPICS)]}."}
        ],
    }


async def measure(url: str, streams: int, max_tokens: int, headers: dict) -> dict:
    async with httpx.AsyncClient(timeout=300, headers=headers) as client:
        await stream_chat(client, url, body(99, 4))  # warm-up
        start = time.perf_counter()
        results = await asyncio.gather(
            *(stream_chat(client, url, body(i, max_tokens)) for i in range(streams))
        )
        wall = time.perf_counter() - start
    tokens = sum(r.tokens for r in results)
    return {
        "streams": streams,
        "tokens": tokens,
        "tokens_per_s": round(tokens / wall, 1),
        "ttft_p95_s": round(percentile([r.ttft_s for r in results], 95), 3),
    }


def bench(start, levels: list[int], max_tokens: int, log_dir: Path) -> dict[int, dict]:
    proc = start(log_dir)
    try:
        return {n: asyncio.run(measure(proc.url, n, max_tokens, proc.headers)) for n in levels}
    finally:
        proc.stop()


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
    peer = bench(
        lambda d: start_llama_cpp_server(d, threads=args.threads, n_ctx=4096),
        levels,
        max_tokens,
        log_dir,
    )
    ours = bench(
        lambda d: start_node(
            "bench-node",
            d,
            threads=args.threads,
            extra_args=["--sequences", "16", "--ctx-per-seq", "512"],
        ),
        levels,
        max_tokens,
        log_dir,
    )
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
