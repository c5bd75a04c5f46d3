"""Rolling upgrades under steady agent traffic (issue 15's benchmark).

Starts the embedded array (``manage.py up --nodes 3``) under a temporary PHALANX_HOME, runs
``--sessions`` concurrent multi-turn agent sessions through the control plane (streamed, a
system prompt with a tool schema, ``--turns`` turns a session, then a new session), and:

1. measures a baseline (``--baseline-s`` seconds of traffic);
2. builds Q4_K_M from the bundled Q4_1 (``manage.py package quantize``: llama.cpp's quantizer),
   approves it with a recorded override (its evaluation is issue 14's benchmark, not this
   one) and rolls it out (``POST /api/upgrades``);
3. makes a deliberately broken version of it (a chat template that raises when rendered),
   pushes it past the package gate with an admin override, rolls it out, and waits for the
   upgrade's own gates (the smoke chat) to roll it back.

Exits non-zero when a goal is missed. Prints failed requests (goal 0), streams cut (goal 0), sessions that changed model version
mid-conversation (goal 0, from the routing table), the turn latency P95 during each upgrade
against the baseline, the upgrade times and the time to roll back; the last line is one JSON
object. Everything runs on loopback; the traffic is bounded by the phases' deadlines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.harness import bundled_model_path, emit, free_port, percentile, spawn  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct-q4_1"
BROKEN_TEMPLATE = "{{ raise_exception('deliberately broken for bench/upgrade.py') }}"
TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Look an order up by its number.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    },
}
SYSTEM = "You are a support agent. Use lookup_order to find orders. Answer briefly."
USER_TURNS = [
    "Hi, where is my order A-1042?",
    "Thanks. Can it arrive before Friday?",
    "What is your returns policy, in one line?",
    "Please summarise what we said.",
    "Goodbye.",
]


@dataclass
class Turn:
    session: str
    phase: str
    ok: bool
    cut: bool
    seconds: float
    error: str = ""


@dataclass
class Traffic:
    """What the session workers saw; ``phase`` is the label new turns get."""

    phase: str = "baseline"
    turns: list[Turn] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)
    stop: bool = False


async def one_turn(
    client: httpx.AsyncClient, url: str, token: str, session: str, messages
) -> tuple[bool, bool, str, str]:
    """(ok, cut, error, reply text) of one streamed turn."""
    body = {
        "model": MODEL,
        "messages": messages,
        "tools": [TOOL],
        "max_tokens": 24,
        "temperature": 0.2,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {token}", "X-Session-Id": session}
    text, done, error = [], False, ""
    try:
        async with client.stream(
            "POST", f"{url}/v1/chat/completions", json=body, headers=headers
        ) as r:
            if r.status_code != 200:
                return False, False, f"HTTP {r.status_code}: {(await r.aread())[:200]!r}", ""
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    event = json.loads(line[6:])
                    if "error" in event:
                        error = str(event["error"].get("message", event["error"]))[:200]
                    for choice in event.get("choices") or []:
                        delta = choice.get("delta") or {}
                        text.append(delta.get("content") or "")
                        for call in delta.get("tool_calls") or []:
                            text.append(json.dumps(call.get("function", {})))
    except httpx.HTTPError as exc:
        return False, True, f"{type(exc).__name__}: {exc}", ""
    if error:
        return False, True, error, ""
    return done, not done, "" if done else "stream ended without [DONE]", "".join(text)


async def session_worker(
    traffic: Traffic, url: str, token: str, turns: int, think_s: float
) -> None:
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(120.0, connect=10.0), trust_env=False
    ) as client:
        while not traffic.stop:
            session = f"bench-{secrets.token_hex(6)}"
            traffic.sessions.append(session)
            messages = [{"role": "system", "content": SYSTEM}]
            for i in range(turns):
                if traffic.stop:
                    break
                messages.append({"role": "user", "content": USER_TURNS[i % len(USER_TURNS)]})
                phase = traffic.phase
                started = time.perf_counter()
                ok, cut, error, reply = await one_turn(client, url, token, session, messages)
                traffic.turns.append(
                    Turn(session, phase, ok, cut, time.perf_counter() - started, error)
                )
                messages.append({"role": "assistant", "content": reply or "(no answer)"})
                await asyncio.sleep(think_s)


class Array:
    """``manage.py up --nodes 3`` under its own PHALANX_HOME, and calls on it."""

    def __init__(self, home: Path, nodes: int) -> None:
        self.port = free_port()
        self.token = "bench-" + secrets.token_hex(12)
        self.env = {"PHALANX_HOME": str(home), "PHALANX_API_TOKEN": self.token}
        for name in ("DATABASE_URL", "REDIS_URL"):
            os.environ.pop(name, None)
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = spawn(
            [sys.executable, "manage.py", "up", "--nodes", str(nodes), "--port", str(self.port)],
            home / "up.log",
            env=self.env,
        )

    def wait(self, nodes: int, timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.popen.poll() is not None:
                raise RuntimeError(self.proc.log()[-3000:])
            try:
                up = [
                    n
                    for n in self.api("GET", "/nodes").json()
                    if n["state"] == "up" and n["validation"] in ("passed", "warned")
                ]
                if len(up) >= nodes:
                    return
            except (httpx.HTTPError, ValueError, TypeError):
                pass
            time.sleep(1.0)
        raise RuntimeError("the array did not come up")

    def api(self, method: str, path: str, **kw) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"}
        return httpx.request(method, f"{self.url}/api{path}", headers=headers, timeout=60, **kw)

    def manage(self, *args: str) -> dict:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=REPO,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(done.stdout.strip().splitlines()[-1])

    def package_id(self, key: str) -> int:
        return next(p["id"] for p in self.api("GET", "/packages").json() if p["key"] == key)

    def approve_over_gate(self, package_id: int, reason: str) -> None:
        r = self.api("POST", f"/packages/{package_id}/approve", json={"override_reason": reason})
        r.raise_for_status()

    def upgrade(self, from_id: int, to_id: int, settings: dict) -> int:
        r = self.api(
            "POST",
            "/upgrades",
            json={"from_package_id": from_id, "to_package_id": to_id, "settings": settings},
        )
        if r.status_code != 201:
            raise RuntimeError(f"upgrade refused: {r.status_code} {r.text}")
        return r.json()["id"]

    def follow(self, upgrade_id: int, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            events = self.api("GET", f"/upgrades/{upgrade_id}/events").json()
            for e in events[seen:]:
                print(
                    f"  {e['at'][11:19]} {e['node_id'] or '-':8} {e['kind']}: {e['message']}",
                    flush=True,
                )
            seen = len(events)
            u = self.api("GET", f"/upgrades/{upgrade_id}").json()
            if u["state"] in ("succeeded", "rolled_back", "failed"):
                return u
            time.sleep(1.0)
        raise RuntimeError(f"upgrade {upgrade_id} did not end within {timeout:.0f} s")

    def stop(self) -> None:
        self.proc.stop(timeout=30)


def version_changes(home: Path, sessions: list[str]) -> int:
    """Sessions of this run whose turns were served by more than one package version."""
    os.environ["PHALANX_HOME"] = str(home)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    from inference.models import SessionRoute

    return SessionRoute.objects.filter(session_id__in=sessions, version_changes__gt=0).count()


def summary(turns: list[Turn], phase: str) -> dict:
    mine = [t for t in turns if t.phase == phase]
    seconds = [t.seconds for t in mine if t.ok]
    return {
        "turns": len(mine),
        "failed": sum(1 for t in mine if not t.ok),
        "cut": sum(1 for t in mine if t.cut),
        "turn_p95_s": round(percentile(seconds, 95), 3),
        "turn_p50_s": round(percentile(seconds, 50), 3),
    }


async def build_q4km(array: Array) -> tuple[int, int, str]:
    """Quantize Q4_K_M from the bundled Q4_1 and approve it over the gate: ``(source id,
    Q4_K_M id, Q4_K_M key)``."""
    built = await asyncio.to_thread(
        array.manage, "package", "quantize", f"{MODEL}:1", "--type", "Q4_K_M"
    )
    q4km_key = built["result"]["package"]
    q4km = await asyncio.to_thread(array.package_id, q4km_key)
    await asyncio.to_thread(
        array.approve_over_gate, q4km, "bench/upgrade.py: tool-call quality is issue 14's benchmark"
    )
    source = await asyncio.to_thread(array.package_id, f"{MODEL}:1")
    return source, q4km, q4km_key


async def broken_package(array: Array, home: Path, q4km_key: str) -> dict:
    """A version of ``q4km_key`` whose chat template raises, approved over the gate (the
    ``manage.py package template`` result: ``id``, ``key``)."""
    template = home / "broken.jinja"
    template.write_text(BROKEN_TEMPLATE)
    broken = await asyncio.to_thread(
        array.manage, "package", "template", q4km_key, "--file", str(template)
    )
    await asyncio.to_thread(
        array.approve_over_gate,
        broken["id"],
        "bench/upgrade.py: deliberately broken, the upgrade's gates must catch it",
    )
    return broken


async def timed_upgrade(
    array: Array, from_id: int, to_id: int, settings: dict, timeout_s: float
) -> tuple[dict, float]:
    """Start an upgrade and follow it to its end: ``(the upgrade, seconds it took)``."""
    started = time.monotonic()
    upgrade = await asyncio.to_thread(
        array.follow,
        await asyncio.to_thread(array.upgrade, from_id, to_id, settings),
        timeout_s,
    )
    return upgrade, time.monotonic() - started


async def run(args, array: Array, home: Path) -> dict:
    traffic = Traffic()
    workers = [
        asyncio.create_task(
            session_worker(traffic, array.url, array.token, args.turns, args.think_s)
        )
        for _ in range(args.sessions)
    ]
    print(f"baseline: {args.sessions} sessions for {args.baseline_s:.0f} s", flush=True)
    await asyncio.sleep(args.baseline_s)

    print("building Q4_K_M from the bundled Q4_1 (llama.cpp's quantizer)", flush=True)
    traffic.phase = "build"
    source, q4km, q4km_key = await build_q4km(array)
    settings = {
        "bake_s": args.bake_s,
        "canary_share": 0.34,
        "max_unavailable": 1,
        "drain_timeout_s": 60,
    }
    print(f"upgrade 1: {MODEL}:1 -> {q4km_key}", flush=True)
    traffic.phase = "upgrade"
    first, upgrade_s = await timed_upgrade(array, source, q4km, settings, args.timeout_s)

    broken = await broken_package(array, home, q4km_key)
    print(f"upgrade 2: {q4km_key} -> {broken['key']} (its chat template raises)", flush=True)
    traffic.phase = "broken"
    second, rollback_s = await timed_upgrade(array, q4km, broken["id"], settings, args.timeout_s)
    traffic.phase = "after"
    await asyncio.sleep(args.after_s)
    traffic.stop = True
    await asyncio.gather(*workers)
    changed = await asyncio.to_thread(version_changes, home, traffic.sessions)
    return result_of(
        traffic,
        sessions=args.sessions,
        changed=changed,
        upgrades=(first, upgrade_s, second, rollback_s),
    )


def result_of(
    traffic: Traffic, *, sessions: int, changed: int, upgrades: tuple[dict, float, dict, float]
) -> dict:
    """The benchmark's result: the traffic's failures, cuts and P95s by phase, ``changed``
    sessions, and ``upgrades`` (the Q4_K_M upgrade and its seconds, the broken one and its)."""
    first, upgrade_s, second, rollback_s = upgrades
    phases = {
        p: summary(traffic.turns, p) for p in ("baseline", "build", "upgrade", "broken", "after")
    }
    errors = sorted({t.error for t in traffic.turns if t.error})[:5]
    base = phases["baseline"]["turn_p95_s"] or 1e-9
    return {
        "benchmark": "upgrade",
        "sessions": sessions,
        "turns_total": len(traffic.turns),
        "failed_requests": sum(1 for t in traffic.turns if not t.ok),
        "streams_cut": sum(1 for t in traffic.turns if t.cut),
        "sessions_changed_model": changed,
        "sessions_total": len(traffic.sessions),
        "upgrade_state": first["state"],
        "upgrade_s": round(upgrade_s, 1),
        "broken_state": second["state"],
        "broken_reason": second["reason"],
        "rollback_s": round(rollback_s, 1),
        "turn_p95_baseline_s": phases["baseline"]["turn_p95_s"],
        "turn_p95_upgrade_s": phases["upgrade"]["turn_p95_s"],
        "turn_p95_broken_s": phases["broken"]["turn_p95_s"],
        "p95_ratio_upgrade_vs_baseline": round(phases["upgrade"]["turn_p95_s"] / base, 2),
        "phases": phases,
        "errors": errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=12)
    parser.add_argument("--turns", type=int, default=4, help="turns a session, then a new one")
    parser.add_argument("--think-s", type=float, default=0.5)
    parser.add_argument("--baseline-s", type=float, default=45.0)
    parser.add_argument("--bake-s", type=float, default=15.0)
    parser.add_argument("--after-s", type=float, default=15.0)
    parser.add_argument("--timeout-s", type=float, default=900.0, help="each upgrade at most")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="phalanx-bench-upgrade-"))
    bundled = bundled_model_path()
    (home / "models").mkdir()
    shutil.copy(bundled, home / "models" / bundled.name)  # as `up` would fetch it
    array = Array(home, nodes=3)
    try:
        array.wait(3)
        result = asyncio.run(run(args, array, home))
    finally:
        array.stop()
    for key in ("failed_requests", "streams_cut", "sessions_changed_model"):
        print(f"{key}: {result[key]} (goal 0)")
    print(
        f"turn latency P95: baseline {result['turn_p95_baseline_s']} s, during the upgrade "
        f"{result['turn_p95_upgrade_s']} s ({result['p95_ratio_upgrade_vs_baseline']}x), during "
        f"the broken one {result['turn_p95_broken_s']} s"
    )
    print(
        f"upgrade to Q4_K_M: {result['upgrade_state']} in {result['upgrade_s']} s; broken "
        f"package: {result['broken_state']} in {result['rollback_s']} s ({result['broken_reason']})"
    )
    emit(result)
    missed = [k for k in ("failed_requests", "streams_cut", "sessions_changed_model") if result[k]]
    if result["upgrade_state"] != "succeeded" or result["broken_state"] != "rolled_back":
        missed.append("outcomes")
    if missed:  # a goal missed is a failed run, not only a printed figure
        raise SystemExit(f"goals missed: {', '.join(missed)}")


if __name__ == "__main__":
    main()
