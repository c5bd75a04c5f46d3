"""How far the array goes: an agent-session trace replayed over 1,000 simulated nodes with the real
routing code, under node failures and a rolling upgrade. No model runs.

The trace: sessions arrive as a Poisson process; each has 4 to 12 turns with think times
(exponential, mean 2 s) between them; a turn adds 60 to 400 new prompt tokens (a tool result, a
user message) to the session's history and decodes 20 to 80 tokens. Every turn is routed by
``inference.routing.route_session`` (the code the proxy runs) over one ``NodeView`` per node,
with the node's live load and pinned sessions.

A node serves like the bundled model on this machine (the service curve): prefill at
``PREFILL_TOK_S`` tokens/s and decode at ``DECODE_TOK_S[c]`` tokens/s in aggregate with c
sequences busy (device validation's figures on this 2-core machine, docs/validation.md: pp512
229 tok/s, decode 110 tok/s at 1 sequence and 181 at 8; ``--curve FILE`` takes another as JSON
``{"prefill_tok_s": x, "decode_tok_s": {"1": y, "8": z, ...}}``, e.g. from a load test's
report). A turn on the node that holds the session's KV prefills only its new tokens; anywhere
else (a new node after a move) it prefills the whole history. A node keeps the KV of at most
``KV_SESSIONS`` sessions (least recently used out). Turns beyond 8 busy sequences queue.

Events: at 30 % of the run 2 % of the nodes fail (down for the rest); from 50 % a rolling
upgrade drains 5 % of the nodes at a time for ``DRAIN_S`` each, then gives them back.

The peer: the same trace with the same routing code in its ``least_loaded`` strategy (no
session affinity: every turn goes to the least loaded node). ``ratio`` is Phalanx's serving
P95 (a session's time less its think times, which both sides wait alike) over the peer's
(below 1: affinity pays at this scale). ``session_p95_s`` includes the think times. The
peer's ``moves`` counts the turns that went to another node than the session's last one.

    python bench/simulate.py [--quick] [--nodes 1000]   # --quick: under 3 minutes

Ends with one JSON line: ``nodes``, ``sessions``, ``session_p95_s``, ``moves``, ``load_spread``
(the busiest node's turns over the mean), the peer's figures and ``ratio``.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import itertools
import json
import math
import os
import random
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

from inference.routing import (  # noqa: E402  (pure: no database, no Django set-up needed)
    LEAST_LOADED,
    Limits,
    NodeView,
    SessionPin,
    route_session,
)

MODEL = "agent-model"
SEQUENCES = 8
KV_SESSIONS = 90  # the sessions' KV a node keeps (device and host RAM), as up's default budget
PREFILL_TOK_S = 229.0
DECODE_TOK_S = {1: 110.0, 8: 181.0}
DRAIN_S = 20.0


@dataclass
class Node:
    node_id: str
    state: str = "up"
    busy: int = 0  # turns on the node now, running or queued past its sequences
    turns: int = 0
    kv: OrderedDict = field(default_factory=OrderedDict)  # session -> tokens held, LRU order


@dataclass
class Session:
    sid: str
    turns: list[tuple[int, int, float]]  # (new prompt tokens, decode tokens, think s after)
    started: float
    history: int = 0
    node: str | None = None
    done: int = 0


class Curve:
    """Aggregate decode tokens/s by busy sequences (linear between the measured points)."""

    def __init__(self, prefill_tok_s: float, decode: dict[int, float]) -> None:
        self.prefill_tok_s = prefill_tok_s
        self.points = sorted(decode.items())

    def per_stream(self, busy: int) -> float:
        c = max(1, min(busy, SEQUENCES))
        below = [p for p in self.points if p[0] <= c] or self.points[:1]
        above = [p for p in self.points if p[0] >= c] or self.points[-1:]
        (c0, r0), (c1, r1) = below[-1], above[0]
        rate = r0 if c1 == c0 else r0 + (r1 - r0) * (c - c0) / (c1 - c0)
        return rate / c


def trace(rate: float, seconds: float, seed: int) -> list[Session]:
    """Sessions arriving at ``rate`` a second for ``seconds``."""
    rng = random.Random(seed)
    sessions, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t > seconds:
            return sessions
        turns = [
            (rng.randint(60, 400), rng.randint(20, 80), rng.expovariate(0.5))
            for _ in range(rng.randint(4, 12))
        ]
        sessions.append(Session(f"s{len(sessions)}", turns, t))


class Simulation:
    """One replay of a trace over ``nodes`` nodes with routing ``limits``."""

    def __init__(self, nodes: int, limits: Limits, curve: Curve, duration: float) -> None:
        self.nodes = {f"n{i:04d}": Node(f"n{i:04d}") for i in range(nodes)}
        self.order = list(self.nodes)
        self.views = {n: self._view(self.nodes[n], 0) for n in self.order}
        self.pinned: dict[str, int] = dict.fromkeys(self.order, 0)
        self.limits, self.curve, self.duration = limits, curve, duration
        self.events: list = []
        self.sequence = itertools.count()
        self.moves = 0
        self.session_s: list[float] = []
        self.serving_s: list[float] = []  # a session's time less its think times

    def _view(self, node: Node, pinned: int) -> NodeView:
        load = node.busy / SEQUENCES
        state = node.state
        return NodeView(node.node_id, state, 1.0, load, MODEL, sessions=pinned, total=SEQUENCES)

    def _refresh(self, node_id: str) -> None:
        self.views[node_id] = self._view(self.nodes[node_id], self.pinned[node_id])

    def _push(self, at: float, kind: str, payload: object) -> None:
        heapq.heappush(self.events, (at, next(self.sequence), kind, payload))

    def run(self, sessions: list[Session]) -> dict:
        for s in sessions:
            self._push(s.started, "turn", s)
        self._schedule_incidents()
        while self.events:
            at, _, kind, payload = heapq.heappop(self.events)
            getattr(self, f"_{kind}")(at, payload)
        return self._summary(len(sessions))

    def _schedule_incidents(self) -> None:
        rng = random.Random(7)
        failed = rng.sample(self.order, max(1, len(self.order) // 50))
        for node_id in failed:
            self._push(self.duration * 0.3, "fail", node_id)
        batch = max(1, len(self.order) // 20)
        at = self.duration * 0.5
        for i in range(0, len(self.order), batch):
            for node_id in self.order[i : i + batch]:
                self._push(at, "drain", node_id)
                self._push(at + DRAIN_S, "undrain", node_id)
            at += DRAIN_S / 2

    def _fail(self, at: float, node_id: str) -> None:
        self.nodes[node_id].state = "down"
        self.nodes[node_id].kv.clear()
        self._refresh(node_id)

    def _drain(self, at: float, node_id: str) -> None:
        if self.nodes[node_id].state == "up":
            self.nodes[node_id].state = "draining"
            self._refresh(node_id)

    def _undrain(self, at: float, node_id: str) -> None:
        node = self.nodes[node_id]
        if node.state == "draining":
            node.state = "up"
            node.kv.clear()  # switched to the new version: its old KV is gone
            self._refresh(node_id)

    def _turn(self, at: float, session: Session) -> None:
        pin = SessionPin(node_id=session.node, idle_s=0.0)
        views = list(self.views.values())
        decision = route_session(
            views, model=MODEL, pin=pin, idle_release_s=3600, limits=self.limits
        ).decision
        node = self.nodes[decision.node_id]
        if session.node is not None and decision.node_id != session.node:
            self.moves += 1
        self._pin(session, decision.node_id)
        new, decode, _ = session.turns[session.done]
        held = node.kv.get(session.sid, 0)
        prefill = session.history + new - held if held else session.history + new
        node.kv[session.sid] = session.history + new + decode
        node.kv.move_to_end(session.sid)
        while len(node.kv) > KV_SESSIONS:
            node.kv.popitem(last=False)
        node.busy, node.turns = node.busy + 1, node.turns + 1
        service = prefill / self.curve.prefill_tok_s + decode / self.curve.per_stream(node.busy)
        wait = max(0, node.busy - SEQUENCES) / SEQUENCES * service  # queued past the sequences
        self._refresh(node.node_id)
        session.history += new + decode
        self._push(at + wait + service, "end", (session, node.node_id))

    def _pin(self, session: Session, node_id: str) -> None:
        if session.node is not None and session.node != node_id:
            self.pinned[session.node] -= 1
            self._refresh(session.node)
        if session.node != node_id:
            self.pinned[node_id] += 1
        session.node = node_id

    def _end(self, at: float, payload: tuple[Session, str]) -> None:
        session, node_id = payload
        node = self.nodes[node_id]
        node.busy -= 1
        self._refresh(node_id)
        think = session.turns[session.done][2]
        session.done += 1
        if session.done < len(session.turns):
            self._push(at + think, "turn", session)
            return
        self.session_s.append(at - session.started)
        self.serving_s.append(at - session.started - sum(t for _, _, t in session.turns[:-1]))
        self.pinned[node_id] -= 1
        self._refresh(node_id)

    def _summary(self, sessions: int) -> dict:
        served = [n.turns for n in self.nodes.values() if n.turns]
        mean = sum(served) / len(served) if served else 1.0
        return {
            "sessions": sessions,
            "session_p95_s": _p95(self.session_s),
            "serving_p95_s": _p95(self.serving_s),
            "moves": self.moves,
            "load_spread": round(max(served, default=0) / mean, 2),
        }


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return round(ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)], 2) if ordered else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--curve", type=Path, default=None, help="service curve as JSON")
    args = parser.parse_args()
    curve = Curve(PREFILL_TOK_S, DECODE_TOK_S)
    if args.curve:
        given = json.loads(args.curve.read_text())
        curve = Curve(
            float(given["prefill_tok_s"]),
            {int(k): float(v) for k, v in given["decode_tok_s"].items()},
        )
    duration = 60.0 if args.quick else 240.0
    rate = args.nodes * 0.06  # about 2.5 sessions open per node at a time
    sessions = trace(rate, duration, seed=1)
    figures = {}
    for name, limits in (("phalanx", Limits()), ("peer", Limits(strategy=LEAST_LOADED))):
        started = time.monotonic()
        figures[name] = Simulation(args.nodes, limits, curve, duration).run(
            [dataclasses.replace(s, turns=list(s.turns)) for s in sessions]
        )
        print(
            f"{name}: {figures[name]} ({time.monotonic() - started:.0f} s to simulate)", flush=True
        )
    ours, peer = figures["phalanx"], figures["peer"]
    print(
        json.dumps(
            {
                "bench": "simulate",
                "nodes": args.nodes,
                **ours,
                "peer": peer,
                "ratio": round(ours["serving_p95_s"] / peer["serving_p95_s"], 3)
                if peer["serving_p95_s"]
                else None,
                "trace_s": duration,
            },
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
