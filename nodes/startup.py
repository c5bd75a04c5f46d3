"""What ``manage.py up`` tells the operator while the array starts (docs/validation.md, "When
the array is ready"): a line per node as it loads, validates, takes sessions or is kept out;
"ready" once new sessions can be placed on every node that passed; and how long validation
should take, from this machine's own last runs (or no estimate, when it has none).

Read from the database the control loop writes (``Node`` and its ``ValidationRun`` rows) with
the rule routing uses (``nodes.selectors.takes_sessions``), so "takes sessions" means what the
proxy will do.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nodes.models import Node, ValidationRun
from nodes.selectors import takes_sessions
from nodes.validation_machines import Placement, may_start

SERVING, KEPT_OUT, LOADING, VALIDATING, QUEUED, DOWN = (
    "serving",
    "kept out",
    "loading",
    "validating",
    "queued",
    "down",
)
SETTLED = (SERVING, KEPT_OUT)
RULE = re.compile(r"([a-z_]+(?:\.[a-z_]+)*): ")
Run = ValidationRun


@dataclass(frozen=True)
class NodeStage:
    """Where one node stands: ``stage`` (one of ``serving``, ``kept out``, ``loading``,
    ``validating``, ``queued``, ``down``) and the sentence ``up`` prints for it."""

    node_id: str
    stage: str
    line: str


def _run_wall_s(run: ValidationRun | None) -> float | None:
    if run is None or run.started_at is None or run.finished_at is None:
        return None
    return (run.finished_at - run.started_at).total_seconds()


def _last_ended(node: Node) -> ValidationRun | None:
    """The node's last run that came to a verdict (one that errored may have waited out a
    timeout: no measure of a run)."""
    verdicts = (Run.State.PASSED, Run.State.WARNED, Run.State.FAILED)
    return node.validation_runs.filter(state__in=verdicts).order_by("-finished_at").first()


def _rules(reason: str) -> str:
    """The rule names of a run's reason ("cpu.build: ...; numa: ..." -> "cpu.build, numa"):
    the sentences are on the node's Validation page; the reason itself when it names none."""
    names = [m.group(1) for part in reason.split("; ") if (m := RULE.match(part))]
    return ", ".join(dict.fromkeys(names)) or reason[:200]


def node_stage(node: Node, open_run: ValidationRun | None) -> NodeStage:
    """The stage of ``node`` (with its open run, if any) and its line."""
    name = node.node_id
    if takes_sessions(node):
        last = _last_ended(node) if node.validation != Node.Validation.WAIVED else None
        took = f" in {wall:.1f} s" if (wall := _run_wall_s(last)) is not None else ""
        said = (
            f" (warnings: {_rules(node.validation_reason)})"
            if node.validation == Node.Validation.WARNED
            else ""
        )
        return NodeStage(name, SERVING, f"{name} takes sessions: {node.validation}{took}{said}")
    if node.state == Node.State.DRAINING or (
        node.validation == Node.Validation.FAILED and open_run is None
    ):
        why = "draining" if node.state == Node.State.DRAINING else node.validation_reason
        return NodeStage(name, KEPT_OUT, f"{name} kept out: {why or node.validation}")
    if node.state == Node.State.UP and node.routing_weight <= 0 and node.validated:
        return NodeStage(name, KEPT_OUT, f"{name} kept out: weight 0")
    if node.state == Node.State.DOWN:
        return NodeStage(name, DOWN, f"{name} down: {node.last_probe_error}")
    if node.state == Node.State.UNKNOWN:
        return NodeStage(name, LOADING, f"{name} loading its model")
    if open_run is not None and open_run.state == Run.State.QUEUED:
        return NodeStage(
            name, QUEUED, f"{name} waits to validate: another run is measuring its CPUs"
        )
    return NodeStage(name, VALIDATING, f"{name} validating its devices (no sessions until done)")


def node_stages(node_ids: Sequence[str]) -> list[NodeStage]:
    """The stage of each of ``node_ids`` that exists, in that order."""
    nodes = {n.node_id: n for n in Node.objects.filter(node_id__in=node_ids)}
    open_runs: dict[int, ValidationRun] = {}
    for run in Run.objects.filter(
        node__in=nodes.values(), state__in=(Run.State.QUEUED, Run.State.RUNNING)
    ):
        open_runs.setdefault(run.node_id, run)
    return [node_stage(nodes[i], open_runs.get(nodes[i].pk)) for i in node_ids if i in nodes]


def schedule_s(durations: Sequence[float], placements: Sequence[Placement]) -> float:
    """Wall seconds until the last of these runs ends when each starts, in order, as soon as
    ``may_start`` lets it beside those running (the control loop's rule): the sum when they
    share CPUs, the longest when each has its own."""
    running: list[tuple[float, Placement]] = []
    waiting = list(zip(durations, placements, strict=True))
    now, ends = 0.0, [0.0]
    while waiting:
        for item in list(waiting):
            if may_start(item[1], [p for _, p in running]):
                running.append((now + item[0], item[1]))
                ends.append(now + item[0])
                waiting.remove(item)
        if waiting:
            now = min(end for end, _ in running)
            running = [(end, p) for end, p in running if end > now]
    return max(ends)


@dataclass(frozen=True)
class Estimate:
    """How long validating the nodes should take (``seconds``; None: no run to go by) and
    the sentence that says so and why."""

    seconds: float | None
    text: str


def validation_estimate(node_ids: Sequence[str]) -> Estimate:
    """From each node's last run that came to a verdict (started to finished; else the
    median of the array's last 20 such runs of any node), scheduled by the control loop's
    rule (``schedule_s``)."""
    nodes = list(Node.objects.filter(node_id__in=node_ids).order_by("node_id"))
    recent = [
        w
        for r in Run.objects.filter(state__in=Run.FINISHED).exclude(state=Run.State.ERROR)[:20]
        if (w := _run_wall_s(r)) is not None
    ]
    walls = [_run_wall_s(_last_ended(n)) for n in nodes]
    if not nodes or (None in walls and not recent):
        return Estimate(None, "no estimate: no validation has finished on this machine yet")
    fallback = statistics.median(recent) if recent else 0.0
    walls = [fallback if w is None else w for w in walls]
    placements = [Placement.of(address=n.address, cpu_set=n.cpu_set) for n in nodes]
    total = schedule_s(walls, placements)
    together = len(nodes) > 1 and total < sum(walls) - 0.05
    how = "together: each has CPUs of its own" if together else "one at a time"
    runs = ", ".join(f"{n.node_id} {w:.0f} s" for n, w in zip(nodes, walls, strict=True))
    return Estimate(total, f"about {total:.0f} s ({how}; the last runs here took {runs})")


class StartupWatch:
    """Lines for ``up`` to print as the array starts: a node's line whenever its stage
    changes, then one "ready" line once every node is settled (takes sessions or is kept
    out), and again when it settles after a later change. ``clock``: seconds (monotonic)."""

    def __init__(
        self,
        node_ids: Sequence[str],
        *,
        base_url: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node_ids, self.base_url, self.clock = list(node_ids), base_url, clock
        self.started = clock()
        self.seen: dict[str, str] = {}
        self.said: tuple[str, ...] | None = None  # the serving nodes "ready" last named

    def poll(self) -> list[str]:
        """What changed since the last poll, as lines to print (may be empty)."""
        stages = node_stages(self.node_ids)
        lines = [s.line for s in stages if self.seen.get(s.node_id) != s.stage]
        self.seen.update({s.node_id: s.stage for s in stages})
        settled = bool(stages) and all(s.stage in SETTLED for s in stages)
        serving = tuple(s.node_id for s in stages if s.stage == SERVING)
        if settled and serving != self.said:
            lines.append(self.ready_line(stages))
        self.said = serving if settled else None
        return lines

    @property
    def ready(self) -> bool:
        """True once the array is settled and at least one node takes sessions."""
        return bool(self.said)

    def ready_line(self, stages: Sequence[NodeStage]) -> str:
        """The line for a settled array: which nodes take sessions, which are kept out."""
        serving = [s.node_id for s in stages if s.stage == SERVING]
        out = [s.node_id for s in stages if s.stage != SERVING]
        after = f"{self.clock() - self.started:.0f} s after the models loaded"
        api = f"OpenAI base URL: {self.base_url}/v1"
        if not serving:
            return f"not serving: no node takes sessions ({after}); see {self.base_url}/validation/"
        if not out:
            return (
                f"ready: new sessions are placed on all {len(serving)} nodes "
                f"({', '.join(serving)}), {after}; {api}"
            )
        return (
            f"ready with {len(serving)} of {len(stages)} nodes ({', '.join(serving)}), {after}; "
            f"kept out: {', '.join(out)} (see {self.base_url}/validation/); {api}"
        )
