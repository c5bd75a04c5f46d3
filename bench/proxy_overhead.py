"""What the control plane's proxy costs: TTFT and decode speed through it against the same node
called directly, in one run.

One node; the control plane (daphne + proxy + control loop) in front of it. Requests alternate
direct / proxied (so drift hits both alike), one at a time, each with a fresh session key and the
same prompt, streamed. TTFT is measured to the first content token; decode tokens/s over the
tokens after it. Reported: ``added_ttft_p50_ms`` (goal <= 5 ms on loopback) and
``ratio`` = proxied / direct decode tokens/s (goal >= 0.97).

    python bench/proxy_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import httpx
from control_plane import ControlPlane
from harness import Proc, emit, percentile, start_node, stream_chat

PROMPT = "Write a short story about a lighthouse keeper and a storm, in plain prose."


async def measure(node: Proc, plane: ControlPlane, requests: int, max_tokens: int) -> dict:
    data: dict[str, dict[str, list[float]]] = {
        m: {"ttft": [], "tps": []} for m in ("direct", "proxied")
    }
    body = {
        "model": "smollm2-135m-instruct-q4_1",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 1,
    }
    async with httpx.AsyncClient(timeout=120) as client:
        for i in range(requests + 2):  # two warm-up rounds
            for mode in ("direct", "proxied") if i % 2 else ("proxied", "direct"):
                url, headers = (
                    (node.url, node.headers) if mode == "direct" else (plane.url, plane.headers)
                )
                result = await stream_chat(
                    client,
                    url,
                    body,
                    headers={**headers, "X-Session-Id": f"{mode}-{i}-{time.time_ns()}"},
                )
                if i < 2 or result.tokens < 2:
                    continue
                data[mode]["ttft"].append(result.ttft_s * 1000)
                data[mode]["tps"].append(
                    (result.tokens - 1) / max(1e-9, result.total_s - result.ttft_s)
                )
    summary = {}
    for mode, d in data.items():
        summary[mode] = {
            "ttft_p50_ms": round(percentile(d["ttft"], 50), 2),
            "ttft_p95_ms": round(percentile(d["ttft"], 95), 2),
            "decode_tokens_per_s_p50": round(percentile(d["tps"], 50), 1),
            "requests": len(d["ttft"]),
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="15 requests each way, within 60 s")
    args = parser.parse_args()
    requests, max_tokens = (15, 32) if args.quick else (80, 96)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    node = start_node("node-01", log_dir, extra_args=["--sequences", "2", "--ctx-per-seq", "1024"])
    plane = None
    try:
        plane = ControlPlane(
            {"node-01": node.url.removeprefix("http://")},
            log_dir,
            policy={"health_interval_s": 2.0, "canary_idle_s": 0},
        )
        result = asyncio.run(measure(node, plane, requests, max_tokens))
    finally:
        if plane is not None:
            plane.stop()
        node.stop()
    added = result["proxied"]["ttft_p50_ms"] - result["direct"]["ttft_p50_ms"]
    ratio = result["proxied"]["decode_tokens_per_s_p50"] / max(
        1e-9, result["direct"]["decode_tokens_per_s_p50"]
    )
    print(
        f"TTFT P50 direct {result['direct']['ttft_p50_ms']} ms, proxied {result['proxied']['ttft_p50_ms']} ms "
        f"(+{added:.2f} ms); decode ratio {ratio:.3f}"
    )
    emit(
        {
            "bench": "proxy_overhead",
            "quick": args.quick,
            **result,
            "added_ttft_p50_ms": round(added, 2),
            "ratio": round(ratio, 3),
        }
    )


if __name__ == "__main__":
    main()
