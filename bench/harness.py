"""Shared pieces of the benchmarks: starting servers, streaming chats, percentiles, JSON output."""

from __future__ import annotations

import asyncio
import json
import math
import os
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# Nodes started here and the control plane started here derive the same node credentials
# (nodes.credentials) from one secret for this run.
os.environ.setdefault("PHALANX_NODE_SECRET", secrets.token_hex(16))
# Nodes keep no shared prefixes on disk unless a benchmark gives them a shelf
# (bench/warm_start.py): a prefix an earlier run saved would warm this run's first turns.
os.environ.setdefault("PHALANX_PREFIX_DIR", "")
# Engines and nodes started here time their settings as at a first start (half a sequence:
# inference.engine.tuning.fill_for), not where another run's or the array's traffic decoded:
# each run starts from no decode-fill history of its own.
os.environ.setdefault(
    "PHALANX_DECODE_FILL_FILE", str(Path(tempfile.mkdtemp(prefix="phalanx-bench-")) / "fill.json")
)

from tests.support.processes import (  # noqa: E402
    Proc,
    bundled_model_path,
    free_port,
    spawn,
    start_control_plane,
    start_node,
    wait_healthy,
)

__all__ = [
    "Proc",
    "bundled_model_path",
    "model_file",
    "free_port",
    "spawn",
    "start_control_plane",
    "start_node",
    "wait_healthy",
]


def model_file(quantization: str | None = None) -> Path:
    """The bundled GGUF (SmolLM2-135M-Instruct Q4_1), or, given a ``quantization`` (a key of
    ``QUANT_LADDER``, e.g. ``Q4_0``: the type the embedded array serves where it is the
    fastest), that type built from it as the package pipeline builds it (``f16`` method),
    once, under ``~/.cache/phalanx-bench/``."""
    bundled = bundled_model_path()
    if not quantization or quantization.upper() == "Q4_1":
        return bundled
    from inference.packages.build import build_quantized

    cache = Path.home() / ".cache" / "phalanx-bench"
    out = cache / f"{bundled.stem}-{quantization.upper()}.gguf"
    if not out.exists():
        cache.mkdir(parents=True, exist_ok=True)
        build_quantized(bundled, out, quantization.upper(), workdir=cache, threads=2)
    return out


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of ``values``; 0.0 for an empty list."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class StreamResult:
    ttft_s: float
    total_s: float
    tokens: int
    text: str
    usage: dict | None
    timings: dict | None = None  # the server's own ``timings`` (llama-server and Phalanx send one)


async def stream_chat(
    client: httpx.AsyncClient, url: str, body: dict, headers: dict | None = None
) -> StreamResult:
    """One streamed chat; counts content events as tokens (both servers send one per token)."""
    start = time.perf_counter()
    ttft = 0.0
    tokens = 0
    parts: list[str] = []
    usage = timings = None
    async with client.stream(
        "POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, headers=headers or {}
    ) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            timings = event.get("timings") or timings
            for choice in event.get("choices") or []:
                content = choice.get("delta", {}).get("content")
                if content:
                    if not ttft:
                        ttft = time.perf_counter() - start
                    tokens += 1
                    parts.append(content)
    total = time.perf_counter() - start
    return StreamResult(ttft, total, tokens, "".join(parts), usage, timings)


async def alternating_streams(
    targets: dict[str, tuple[str, dict[str, str]]], body: dict, requests: int
) -> dict[str, dict]:
    """Stream ``body`` to each target (``name: (url, headers)``) in turn, ``requests`` times
    each after two warm-up rounds, the order reversed every other round (drift hits all alike),
    each with a fresh session key. Per target: TTFT P50 / P95 (ms) to the first content token
    and decode tokens/s P50 over the tokens after it."""
    data: dict[str, dict[str, list[float]]] = {m: {"ttft": [], "tps": []} for m in targets}
    order = list(targets)
    async with httpx.AsyncClient(timeout=120) as client:
        for i in range(requests + 2):
            for mode in order if i % 2 else order[::-1]:
                url, headers = targets[mode]
                session = {"X-Session-Id": f"{mode}-{i}-{time.time_ns()}"}
                result = await stream_chat(client, url, body, headers={**headers, **session})
                if i < 2 or result.tokens < 2:
                    continue
                data[mode]["ttft"].append(result.ttft_s * 1000)
                decode_s = max(1e-9, result.total_s - result.ttft_s)
                data[mode]["tps"].append((result.tokens - 1) / decode_s)
    return {
        mode: {
            "ttft_p50_ms": round(percentile(d["ttft"], 50), 2),
            "ttft_p95_ms": round(percentile(d["ttft"], 95), 2),
            "decode_tokens_per_s_p50": round(percentile(d["tps"], 50), 1),
            "requests": len(d["ttft"]),
        }
        for mode, d in data.items()
    }


def added_and_ratio(summary: dict[str, dict], base: str, other: str) -> tuple[float, float]:
    """``other``'s TTFT P50 minus ``base``'s (ms) and ``other``'s decode tokens/s P50 over
    ``base``'s, from ``alternating_streams``' summary."""
    added = summary[other]["ttft_p50_ms"] - summary[base]["ttft_p50_ms"]
    tps = summary[base]["decode_tokens_per_s_p50"]
    return added, summary[other]["decode_tokens_per_s_p50"] / max(1e-9, tps)


def start_llama_cpp_server(log_dir: Path, *, threads: int, n_ctx: int) -> Proc:
    """llama-cpp-python's own OpenAI server with the bundled model (the peer)."""
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(bundled_model_path()),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_threads",
        str(threads),
        "--n_threads_batch",
        str(threads),
        "--n_ctx",
        str(n_ctx),
        "--interrupt_requests",
        "False",
        "--model_alias",
        "smollm2-135m-instruct-q4_1",
        "--verbose",
        "False",
    ]
    proc = spawn(args, log_dir / "llama_cpp_server.log")
    proc.url = f"http://127.0.0.1:{port}"
    return wait_until_up(proc, "/v1/models", "llama_cpp.server", timeout=90)


def wait_until_up(proc: Proc, path: str, name: str, *, timeout: float) -> Proc:
    """``proc`` once ``GET path`` answers 200; ``RuntimeError`` with its log's tail when it
    exits first, or naming it after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(proc.log()[-3000:])
        try:
            if httpx.get(f"{proc.url}{path}", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{name} did not start")


def emit(result: dict) -> None:
    """Print the benchmark's last line: one JSON object."""
    print(json.dumps(result, sort_keys=True))


def run(coro):
    return asyncio.run(coro)
