"""What usage accounting and rate limits cost on the hot path, and whether a limit holds exactly
under a burst, in one run.

One node; two control planes in front of it (their own databases, the same node). Plane A runs
with accounting off (``PHALANX_USAGE_ACCOUNTING=0``: nothing counted, limited or queued); plane
B with it on and the admin role (the environment's token) given a default quota with every
limit set high, so each turn is checked against requests and tokens per minute, tokens per day,
concurrent sessions and ``max_tokens``, leased, metered and recorded. Requests alternate A / B,
one at a time, fresh session each, the same prompt, streamed (as ``bench/proxy_overhead.py``).

Reported: ``added_ttft_p50_ms`` = B - A TTFT P50 (goal, a share of the proxy's 5 ms budget:
<= 1 ms for a caller without limits, ``--no-limits``; <= 2 ms with every limit set on the
embedded array's store (SQLite: in memory, written behind), <= 1 ms on Redis), ``ratio`` = B / A decode tokens/s P50 (goal >= 0.98); then a burst of 200 one-token requests from 4 concurrent clients
with a token limited to 60 requests per minute, started early in a UTC minute: ``admitted``
(goal: exactly ``limit``), ``refused`` (429s, each with Retry-After) and ``counted`` (the
burst's requests in ``/api/usage``, goal: ``admitted``).

    python bench/usage.py [--quick] [--redis] [--no-limits]
    # --redis: plane B keeps its limits in Redis; --no-limits: the admin role gets only a
    # priority (accounting without limit checks); the burst token is limited either way
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
from control_plane import ControlPlane
from harness import Proc, added_and_ratio, alternating_streams, emit, start_node

PROMPT = "Write a short story about a lighthouse keeper and a storm, in plain prose."
MODEL = "smollm2-135m-instruct-q4_1"
LIMIT = 60
BURST = 200
CLIENTS = 4
HIGH = {  # every limit set, none reached: each check runs
    "requests_per_minute": 1_000_000,
    "tokens_per_minute": 2_000_000_000,
    "tokens_per_day": 10**12,
    "concurrent_sessions": 100_000,
    "max_tokens": 4096,
    "priority": 5,
}
SETUP = """
import django, json, sys; django.setup()
from console.models import Role
from inference.tokens import token_issue
from inference.usage.quotas import quota_set
high, limit = json.loads(sys.argv[1]), int(sys.argv[2])
quota_set(changes=high, role="admin")
token, raw = token_issue(name="burst", role=Role.OPERATOR)
quota_set(changes={"requests_per_minute": limit}, token_id=token.pk)
print(raw)
"""


def quotas(plane: ControlPlane, high: dict) -> str:
    """Set the quotas on ``plane``'s database; the burst token's plaintext."""
    import json

    done = subprocess.run(
        [sys.executable, "-c", SETUP, json.dumps(high), str(LIMIT)],
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, **plane.env},
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip().splitlines()[-1]


def alternate(planes: dict[str, ControlPlane], requests: int, max_tokens: int) -> dict:
    """TTFT and decode tokens/s through each plane, requests alternating between them."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 1,
    }
    targets = {mode: (plane.url, plane.headers) for mode, plane in planes.items()}
    return asyncio.run(alternating_streams(targets, body, requests))


async def burst(plane: ControlPlane, raw: str) -> dict:
    """``BURST`` one-token requests from ``CLIENTS`` clients with the limited token, started
    in the first seconds of a UTC minute (the limit's window)."""
    second = datetime.now(UTC).second + datetime.now(UTC).microsecond / 1e6
    await asyncio.sleep((60.5 - second) % 60 if second > 20 else 0)
    start_minute = datetime.now(UTC).replace(second=0, microsecond=0)
    statuses: list[int] = []
    retry_after: list[bool] = []
    pending = iter(range(BURST))
    headers = {"Authorization": f"Bearer {raw}"}

    async def client_loop(client: httpx.AsyncClient) -> None:
        for i in pending:
            body = {
                "model": MODEL,
                "max_tokens": 1,
                "messages": [{"role": "user", "content": "hi"}],
            }
            answer = await client.post(
                f"{plane.url}/v1/chat/completions",
                json=body,
                headers={**headers, "X-Session-Id": f"burst-{i}"},
            )
            statuses.append(answer.status_code)
            if answer.status_code == 429:
                retry_after.append(bool(answer.headers.get("Retry-After")))

    async with httpx.AsyncClient(timeout=120) as client:
        started = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(CLIENTS)))
        elapsed = time.perf_counter() - started
        straddled = datetime.now(UTC).replace(second=0, microsecond=0) != start_minute
        await asyncio.sleep(1.5)  # the recorder writes every 0.5 s
        usage = (await client.get(f"{plane.url}/api/usage?hours=1", headers=plane.headers)).json()
    counted = sum(r["requests"] for r in usage["rows"] if r["name"] == "burst")
    return {
        "limit": LIMIT,
        "requests": BURST,
        "admitted": statuses.count(200),
        "refused": statuses.count(429),
        "refused_with_retry_after": sum(retry_after),
        "other_statuses": sorted({s for s in statuses if s not in (200, 429)}),
        "counted": counted,
        "burst_s": round(elapsed, 2),
        "straddled_minutes": straddled,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="15 requests each way")
    parser.add_argument("--redis", action="store_true", help="plane B's limits in Redis")
    parser.add_argument("--no-limits", action="store_true", help="plane B's caller unlimited")
    args = parser.parse_args()
    requests, max_tokens = (15, 32) if args.quick else (60, 96)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-usage-"))
    node = start_node("node-01", log_dir, extra_args=["--sequences", "2", "--ctx-per-seq", "1024"])
    planes: dict[str, ControlPlane] = {}
    policy = {"health_interval_s": 2.0, "canary_idle_s": 0}
    b_env = {"REDIS_URL": "redis://127.0.0.1:6379/0"} if args.redis else {}
    try:
        for mode, env in (("off", {"PHALANX_USAGE_ACCOUNTING": "0"}), ("on", b_env)):
            plane_dir = log_dir / mode
            plane_dir.mkdir()
            planes[mode] = ControlPlane(_nodes(node), plane_dir, policy=policy, env=env)
        raw = quotas(planes["on"], {"priority": 5} if args.no_limits else HIGH)
        result = alternate(planes, requests, max_tokens)
        limited = asyncio.run(burst(planes["on"], raw))
    finally:
        for plane in planes.values():
            plane.stop()
        node.stop()
    _report(result, limited, args)


def _nodes(node: Proc) -> dict[str, str]:
    return {"node-01": node.url.removeprefix("http://")}


def _report(result: dict, limited: dict, args: argparse.Namespace) -> None:
    added, ratio = added_and_ratio(result, "off", "on")
    print(
        f"TTFT P50 accounting off {result['off']['ttft_p50_ms']} ms, on "
        f"{result['on']['ttft_p50_ms']} ms (+{added:.2f} ms); decode ratio {ratio:.3f}; "
        f"burst: {limited['admitted']} of {limited['requests']} admitted (limit {LIMIT}), "
        f"{limited['counted']} counted"
    )
    emit(
        {
            "bench": "usage",
            "quick": args.quick,
            # the planes run on SQLite: the embedded array's store (limit_store_memory)
            "limits_store": "redis" if args.redis else "memory",
            "caller_limits": "none" if args.no_limits else "all",
            **result,
            "added_ttft_p50_ms": round(added, 2),
            "ratio": round(ratio, 3),
            "burst": limited,
        }
    )


if __name__ == "__main__":
    main()
