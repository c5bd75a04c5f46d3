"""How far one control plane goes: proxied requests/s before its added latency passes 5 ms, with
one replica and with two behind one port, and the routing decision's cost at 10, 100 and 1,000
nodes.

Throughput: instant fake nodes (``bench/instant_node.py``: a finished answer at once, no model)
behind the control plane on PostgreSQL and Redis (the machine's own on loopback, as the replicas
share them). At each concurrency level the same closed-loop client sends agent-like traffic
(sessions of 8 turns, non-streamed) for a fixed time straight to the nodes (the peer) and then
through the control plane; ``added_ms`` is the proxied P50 latency minus the direct one.
``rps_one_replica`` / ``rps_two_replicas`` are the highest proxied requests/s among the levels
whose added P50 stays within 5 ms (the goal of docs/control-plane.md "The hot path"); ``ratio``
is two replicas over one. The load generator, the nodes and the replicas share this machine's
CPUs: on 2 cores a second replica competes with the client for the same cores.

Decision cost: ``inference.routing.route_session`` (the real, pure routing code) over N node
views with random loads, for a new session (it scans every node) and a pinned one, in
microseconds per decision; ``decision_scaling`` is the 1,000-node cost over the 10-node one.

    python bench/control_plane_scale.py [--quick]      # --quick: under 3 minutes

Ends with one JSON line: ``rps_one_replica``, ``rps_two_replicas``, ``decision_us`` ({nodes:
us}), the step tables and ``ratio``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from harness import Proc, emit, free_port, percentile, spawn, wait_healthy

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "instant"
TOKEN = "bench-scale-token"
GOAL_ADDED_MS = 5.0
TURNS_A_SESSION = 8


# --- the routing decision --------------------------------------------------------------------


def decision_us(node_count: int, rounds: int) -> dict[str, float]:
    """Microseconds per ``route_session`` decision over ``node_count`` nodes: a new session's
    placement and a pinned session's turn."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    django.setup()
    from inference.routing import NodeView, SessionPin, route_session

    rng = random.Random(node_count)
    views = [
        NodeView(f"n{i}", "up", 1.0, rng.random(), PACKAGE, sessions=rng.randrange(50), total=8.0)
        for i in range(node_count)
    ]
    out = {}
    for name, pin in (("new", SessionPin()), ("pinned", SessionPin(node_id="n0", idle_s=5.0))):
        started = time.perf_counter()
        for _ in range(rounds):
            route_session(views, model=PACKAGE, pin=pin, idle_release_s=3600.0)
        out[name] = round((time.perf_counter() - started) / rounds * 1e6, 2)
    return out


# --- the array: instant nodes, PostgreSQL, Redis, replicas ------------------------------------

SETUP = """
from django.utils import timezone
from inference.models import ModelPackage, RoutingPolicy
from nodes.models import Node
import sys
pkg = ModelPackage.objects.create(name="instant", version="1", gguf_path="x", sha256="")
for i, port in enumerate(sys.argv[1:]):
    Node.objects.create(node_id=f"node-{i + 1:02d}", address=f"127.0.0.1:{port}", package=pkg,
        state="up", validation="waived", last_probe_at=timezone.now(),
        last_seen_load={"load": 0.0})
policy = RoutingPolicy.load()
policy.max_inflight_per_node = 0
policy.save()
"""


def prepare(database: str, redis: str, node_ports: list[int]) -> dict[str, str]:
    """Migrate the database and register the nodes; returns the replicas' environment."""
    env = {
        "DATABASE_URL": database,
        "REDIS_URL": redis,
        "PHALANX_HOME": tempfile.mkdtemp(prefix="phalanx-scale-"),
        "PHALANX_API_TOKEN": TOKEN,
        "DJANGO_SETTINGS_MODULE": "console.settings",
    }
    full = {**os.environ, **env}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=REPO, env=full, check=True)
    code = ["-c", "import django; django.setup()\n" + SETUP, *map(str, node_ports)]
    subprocess.run([sys.executable, *code], cwd=REPO, env=full, check=True)
    return env


def start_replicas(count: int, env: dict[str, str], log_dir: Path) -> tuple[list[Proc], str]:
    """``count`` control planes accepting from one listening socket (as ``up --replicas``)."""
    port = free_port()
    shared = socket.socket()
    shared.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    shared.bind(("127.0.0.1", port))
    shared.listen(1024)
    shared.set_inheritable(True)
    procs = []
    for i in range(count):
        args = [sys.executable, "manage.py", "serve", "--port", str(port)]
        log = open(log_dir / f"replica-{i}.log", "wb")
        popen = subprocess.Popen(
            [*args, "--fd", str(shared.fileno())],
            cwd=REPO,
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=[shared.fileno()],
            start_new_session=True,
        )
        procs.append(Proc(popen=popen, log_path=log_dir / f"replica-{i}.log"))
    shared.close()
    url = f"http://127.0.0.1:{port}"
    for proc in procs:  # each must be serving before the load starts
        wait_healthy(url, proc, timeout=60)
    time.sleep(2.0)  # the last one's first requests warm in the warm-up round, not the first step
    return procs, url


# --- the load --------------------------------------------------------------------------------


async def closed_loop(urls: list[str], concurrency: int, seconds: float, headers: dict) -> dict:
    """``concurrency`` workers sending turns for ``seconds``; worker w goes round ``urls``
    (the nodes, direct) or always to the one URL given (the control plane)."""
    latencies: list[float] = []
    errors = 0
    deadline = time.monotonic() + seconds
    run = uuid.uuid4().hex[:8]  # fresh sessions each time: every side places as many
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency)

    async def worker(w: int, client: httpx.AsyncClient) -> None:
        nonlocal errors
        turn = 0
        while time.monotonic() < deadline:
            session = f"{run}-w{w}-{turn // TURNS_A_SESSION}"
            body = {"model": PACKAGE, "messages": [{"role": "user", "content": f"turn {turn}"}]}
            started = time.perf_counter()
            response = await client.post(
                f"{urls[(w + turn) % len(urls)]}/v1/chat/completions",
                json=body,
                headers={**headers, "X-Session-Id": session},
            )
            if response.status_code == 200:
                latencies.append((time.perf_counter() - started) * 1000)
            else:
                errors += 1
            turn += 1

    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        await asyncio.gather(*(worker(w, client) for w in range(concurrency)))
    return {
        "rps": round(len(latencies) / seconds, 1),
        "p50_ms": round(percentile(latencies, 50), 3),
        "p95_ms": round(percentile(latencies, 95), 3),
        "errors": errors,
    }


def steps(plane_url: str, node_urls: list[str], levels: list[int], seconds: float) -> list[dict]:
    """Direct and proxied at each concurrency level (order alternating, so drift hits both)."""
    rows = []
    for i, c in enumerate(levels):
        order = ("direct", "proxied") if i % 2 == 0 else ("proxied", "direct")
        got = {}
        for mode in order:
            urls, headers = (
                (node_urls, {})
                if mode == "direct"
                else ([plane_url], {"Authorization": f"Bearer {TOKEN}"})
            )
            got[mode] = asyncio.run(closed_loop(urls, c, seconds, headers))
        added = round(got["proxied"]["p50_ms"] - got["direct"]["p50_ms"], 3)
        rows.append(
            {
                "concurrency": c,
                "direct": got["direct"],
                "proxied": got["proxied"],
                "added_ms": added,
            }
        )
        print(
            f"  c={c:>3}: direct {got['direct']}, proxied {got['proxied']}, added P50 {added} ms",
            flush=True,
        )
    return rows


def within_goal(rows: list[dict]) -> float:
    """The highest proxied requests/s among the levels whose added P50 is within the goal."""
    return max((r["proxied"]["rps"] for r in rows if r["added_ms"] <= GOAL_ADDED_MS), default=0.0)


def run_replicas(
    count: int, env: dict, node_urls: list[str], levels: list[int], seconds: float, log_dir: Path
) -> list[dict]:
    procs, url = start_replicas(count, env, log_dir)
    try:
        asyncio.run(closed_loop([url], 2, 1.0, {"Authorization": f"Bearer {TOKEN}"}))  # warm-up
        print(f"{count} replica(s) at {url}:", flush=True)
        return steps(url, node_urls, levels, seconds)
    finally:
        for proc in procs:
            proc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    levels, seconds = ([1, 4, 16], 3.0) if args.quick else ([1, 2, 4, 8, 16, 32], 6.0)
    rounds = 2000 if args.quick else 10000
    decisions = {n: decision_us(n, rounds if n < 1000 else rounds // 10) for n in (10, 100, 1000)}
    print("routing decision (us): " + ", ".join(f"{n} nodes {d}" for n, d in decisions.items()))
    from tests.support.postgres import fresh_database, redis_url

    log_dir = Path(tempfile.mkdtemp(prefix="phalanx-bench-scale-"))
    ports = [free_port() for _ in range(4)]
    nodes = spawn(
        [sys.executable, str(REPO / "bench" / "instant_node.py"), *map(str, ports)],
        log_dir / "nodes.log",
    )
    node_urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        for url in node_urls:
            wait_healthy(url, nodes, timeout=30)
        with fresh_database("phalanx_scale") as database:
            env = prepare(database, redis_url(), ports)
            one = run_replicas(1, env, node_urls, levels, seconds, log_dir)
            two = run_replicas(2, env, node_urls, levels, seconds, log_dir)
    finally:
        nodes.stop()
    rps_one, rps_two = within_goal(one), within_goal(two)
    emit(
        {
            "bench": "control_plane_scale",
            "rps_one_replica": rps_one,
            "rps_two_replicas": rps_two,
            "ratio": round(rps_two / rps_one, 3) if rps_one else None,
            "decision_us": {str(n): d["new"] for n, d in decisions.items()},
            "decision_pinned_us": {str(n): d["pinned"] for n, d in decisions.items()},
            "decision_scaling": round(decisions[1000]["new"] / decisions[10]["new"], 1),
            "goal_added_ms": GOAL_ADDED_MS,
            "steps_one_replica": one,
            "steps_two_replicas": two,
            "cpus": os.cpu_count(),
        }
    )


if __name__ == "__main__":
    main()
