"""What the control plane's proxy costs: TTFT and decode speed through it against the same node
called directly, in one run.

One node; the control plane (daphne + proxy + control loop) in front of it. Requests alternate
direct / proxied (so drift hits both alike), one at a time, each with a fresh session key and the
same prompt, streamed. TTFT is measured to the first content token; decode tokens/s over the
tokens after it. Reported: ``added_ttft_p50_ms`` (goal <= 3 ms on loopback, issue 34) and
``ratio`` = proxied / direct decode tokens/s (goal >= 0.98).

Measured as the issue asks, with usage accounting, log shipping (both on by default) and rate
limits on: the bench token's role gets a quota (``LIMITS``: far above what the run sends, so
nothing is refused, but every request is admitted against its windows and settled after, in
the control plane's database). ``--no-limits`` leaves the quota out, to see what the limits
cost.

    python bench/proxy_overhead.py [--quick] [--no-limits]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from control_plane import ControlPlane
from harness import Proc, added_and_ratio, alternating_streams, emit, start_node

LIMITS = {"requests_per_minute": 100_000, "tokens_per_minute": 100_000_000}
PROMPT = "Write a short story about a lighthouse keeper and a storm, in plain prose."


def measure(node: Proc, plane: ControlPlane, requests: int, max_tokens: int) -> dict:
    body = {
        "model": "smollm2-135m-instruct-q4_1",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 1,
    }
    targets = {"direct": (node.url, node.headers), "proxied": (plane.url, plane.headers)}
    return asyncio.run(alternating_streams(targets, body, requests))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="15 requests each way, within 60 s")
    parser.add_argument("--no-limits", action="store_true", help="no rate limits on the token")
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
            quota=None if args.no_limits else LIMITS,
        )
        result = measure(node, plane, requests, max_tokens)
    finally:
        if plane is not None:
            plane.stop()
        node.stop()
    added, ratio = added_and_ratio(result, "direct", "proxied")
    print(
        f"TTFT P50 direct {result['direct']['ttft_p50_ms']} ms, proxied {result['proxied']['ttft_p50_ms']} ms "
        f"(+{added:.2f} ms); decode ratio {ratio:.3f}"
    )
    emit(
        {
            "bench": "proxy_overhead",
            "quick": args.quick,
            "rate_limits": not args.no_limits,
            **result,
            "added_ttft_p50_ms": round(added, 2),
            "ratio": round(ratio, 3),
        }
    )


if __name__ == "__main__":
    main()
