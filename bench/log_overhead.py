"""What shipping log records costs: the proxy-overhead workload through an array whose every
process ships its records to the control plane's store, against the same array with shipping
off, in one run.

Two arrays side by side (each a node agent, a control plane and a control loop on loopback):
``on`` ships (the node to its control plane over HTTP, the control plane and control loop to
their database), ``off`` runs with ``PHALANX_SHIP_LOGS=0``. Requests alternate on / off (so
drift hits both alike), one at a time, each with a fresh session, the same prompt, streamed
through the proxy. Reported: ``added_ttft_p50_ms`` = on - off TTFT P50 (goal <= 1 ms),
``ratio`` = on / off decode tokens/s P50 (goal >= 0.98), ``records_per_s`` the records the
``on`` array stored per second of the run, and ``dropped``: the turns' records (one from the
proxy, one from the node, found by request id) that never reached the store.

    python bench/log_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from control_plane import ControlPlane
from harness import emit, free_port, percentile, start_node, stream_chat
from proxy_overhead import PROMPT

SIDES = ("on", "off")


def start_array(side: str, log_dir: Path) -> tuple:
    """(node, plane) of one side; ``on`` ships, ``off`` does not."""
    home = Path(tempfile.mkdtemp(prefix=f"bench-logs-{side}-"))
    port = free_port()
    ships = {"PHALANX_SHIP_LOGS": "1" if side == "on" else "0"}
    node_env = {**ships, "PHALANX_HOME": str(home), "PHALANX_LOGS_URL": f"http://127.0.0.1:{port}"}
    (log_dir / side).mkdir(parents=True, exist_ok=True)
    node = start_node(
        f"node-{side}",
        log_dir / side,
        extra_args=["--sequences", "2", "--ctx-per-seq", "1024"],
        env=node_env,
    )
    plane = ControlPlane(
        {f"node-{side}": node.url.removeprefix("http://")},
        log_dir / side,
        policy={"health_interval_s": 2.0, "canary_idle_s": 0},
        env=ships,
        home=home,
        port=port,
    )
    return node, plane


async def measure(planes: dict[str, ControlPlane], requests: int, max_tokens: int) -> dict:
    data = {side: {"ttft": [], "tps": [], "ids": []} for side in SIDES}
    body = {
        "model": "smollm2-135m-instruct-q4_1",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 1,
    }
    async with httpx.AsyncClient(timeout=120) as client:
        for i in range(requests + 2):  # two warm-up rounds
            for side in SIDES if i % 2 else SIDES[::-1]:
                request_id = f"bench-{side}-{i}-{uuid.uuid4().hex[:8]}"
                headers = {
                    **planes[side].headers,
                    "X-Session-Id": f"{side}-{i}-{time.time_ns()}",
                    "X-Request-Id": request_id,
                }
                result = await stream_chat(client, planes[side].url, body, headers=headers)
                if i < 2 or result.tokens < 2:
                    continue
                data[side]["ttft"].append(result.ttft_s * 1000)
                data[side]["tps"].append(
                    (result.tokens - 1) / max(1e-9, result.total_s - result.ttft_s)
                )
                data[side]["ids"].append(request_id)
    return data


def stored(plane: ControlPlane, request_ids: list[str]) -> tuple[int, int]:
    """(records the store holds, turns' records missing: 2 a turn, the proxy's and the
    node's)."""
    time.sleep(3)  # the last second's records are shipped every second
    page = httpx.get(
        f"{plane.url}/api/logs", params={"limit": 1000}, headers=plane.headers, timeout=30
    ).json()["records"]
    total = httpx.get(
        f"{plane.url}/api/logs", params={"format": "jsonl"}, headers=plane.headers, timeout=60
    ).text.count("\n")
    found = {(r["request_id"], r["process"]) for r in page if r["request_id"] in request_ids}
    missing = sum(
        (rid, process) not in found for rid in request_ids for process in ("serve", "runnode")
    )
    return total, missing


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="15 requests a side, about 90 s")
    args = parser.parse_args()
    requests, max_tokens = (15, 32) if args.quick else (80, 96)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-logs-"))
    arrays: dict[str, tuple] = {}
    try:
        for side in SIDES:
            arrays[side] = start_array(side, log_dir)
        started = time.monotonic()
        data = asyncio.run(measure({s: a[1] for s, a in arrays.items()}, requests, max_tokens))
        elapsed = time.monotonic() - started
        records, missing = stored(arrays["on"][1], data["on"]["ids"])
    finally:
        for node, plane in arrays.values():
            plane.stop()
            node.stop()
    p50 = {side: percentile(data[side]["ttft"], 50) for side in SIDES}
    tps = {side: percentile(data[side]["tps"], 50) for side in SIDES}
    added, ratio = p50["on"] - p50["off"], tps["on"] / max(1e-9, tps["off"])
    print(
        f"TTFT P50 shipping off {p50['off']:.2f} ms, on {p50['on']:.2f} ms (+{added:.2f} ms); "
        f"decode ratio {ratio:.3f}; {records / elapsed:.1f} records/s stored, {missing} dropped"
    )
    emit(
        {
            "bench": "log_overhead",
            "quick": args.quick,
            "requests": len(data["on"]["ttft"]),
            "ttft_p50_ms": {side: round(v, 2) for side, v in p50.items()},
            "decode_tokens_per_s_p50": {side: round(v, 1) for side, v in tps.items()},
            "added_ttft_p50_ms": round(added, 2),
            "ratio": round(ratio, 3),
            "records_per_s": round(records / elapsed, 1),
            "dropped": missing,
        }
    )


if __name__ == "__main__":
    main()
