"""Load-test runs as jobs: the worker that runs one (``loadtest_execute``) and the control
loop's side (``loadtests_tick``), which starts each queued run in its own process
(``manage.py loadtestjob ID``), never in daphne.

The row is the truth. The worker writes the live figures and a heartbeat once a second (and a
``LoadTestSample`` row for the live page), and the records of each step when it ends. A run
whose worker died (the machine, the control loop or the worker restarted; its heartbeat is
older than ``LOADTEST_STALE_S``) is queued again and resumes after its last finished step, up
to ``MAX_ATTEMPTS`` times; the steps it had finished keep their records. A stop is the row's
``cancel_requested``: the worker polls it four times a second and stops every open request.

Claiming: ``queued -> running`` in one conditional UPDATE, by the control loop (which then
starts the worker) or by ``manage.py loadtest`` running in its own process; each write of a
worker goes through its ``Claim``, so a worker that was given up cannot write over the next.

Credentials: a run with no token of its own gets one minted by its worker only after the target
proved it is this control plane (``identity``), recorded on the row (``credentials``); ending
the run, queuing it again or giving up on it revokes every token on the row. The loop signals
only a worker it started and has not reaped (its pid cannot have been reused), never a pid
from the row.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.db import close_old_connections, connection
from django.db.models import Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from console.lib.jobs import Lease, ProcessRunner, adopt, beat_is_fresh, claim
from inference.loadtests.credentials import run_token_mint, run_tokens_revoke
from inference.loadtests.identity import NotThisControlPlane, Proven, aprove
from inference.loadtests.models import CostModel, LoadTestRun, LoadTestSample
from inference.loadtests.profiling import Profiler, attest_control_plane, attest_node
from inference.loadtests.report import build_report
from inference.loadtests.runner import LoadRun, Target, direct_client
from inference.loadtests.scenario import Scenario, parse_scenario

log = logging.getLogger(__name__)
State = LoadTestRun.State
MAX_ATTEMPTS = 3
VALIDATION_WAIT_S = 180.0
PROCESSES = ProcessRunner("loadtestjob", "loadtest")  # the workers this control loop started


def _claim(run_id: int, *, pid: int | None) -> bool:
    """``queued`` -> ``running`` unless someone took it first; True when this caller did (a
    resumed run keeps its first ``started_at``)."""
    return claim(
        LoadTestRun,
        run_id,
        pid=pid,
        started_at=Coalesce("started_at", Value(timezone.now())),
        message="starting",
    )


# --- the worker ------------------------------------------------------------------------------


def loadtest_execute(
    run_id: int, *, claimed: bool = False, attempt: int | None = None, echo=None
) -> LoadTestRun:
    """Run ``run_id`` in this process to its end (or its stop); the outcome is in the row.
    ``claimed``: the control loop claimed it (attempt ``attempt``) and started this process,
    which does nothing once that attempt was given up; otherwise it is claimed here (a run
    someone else holds is left to them). ``echo(line)`` gets a progress line a second
    (``manage.py loadtest`` prints them)."""
    if not claimed and not _claim(run_id, pid=os.getpid()):
        return LoadTestRun.objects.get(pk=run_id)
    claim = adopt(LoadTestRun, run_id, attempt=attempt if claimed else None)
    if claim is None:  # given up (and perhaps claimed again) before this process began
        return LoadTestRun.objects.get(pk=run_id)
    run = LoadTestRun.objects.get(pk=run_id)
    worker = Worker(run, claim, echo=echo)
    try:
        asyncio.run(worker.main())
    finally:
        close_old_connections()
    return LoadTestRun.objects.get(pk=run_id)


class Worker:
    """One attempt at one run: the ``LoadRun``'s hooks write the row from a single database
    thread (one connection), the report is written at the end whatever happened."""

    def __init__(self, run: LoadTestRun, claim: Lease, *, echo=None) -> None:
        self.run, self.claim, self.echo = run, claim, echo
        self.db = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"loadtest-{run.pk}-db")
        # stop polls never wait behind a write (a step's records, a busy database)
        self.polls = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"loadtest-{run.pk}-stop")
        self.scenario: Scenario = parse_scenario(run.scenario)
        self.proven: Proven | None = None  # the target proved it is this control plane
        self.minted = False  # the run's token was minted here (only for a proven target)
        self.profiler: Profiler | None = None

    async def _poll_stop(self) -> bool:
        return await asyncio.get_running_loop().run_in_executor(self.polls, self._stop_wanted)

    async def _db(self, fn, *args, **kwargs):
        return await asyncio.get_running_loop().run_in_executor(
            self.db, lambda: fn(*args, **kwargs)
        )

    async def main(self) -> None:
        state, error = State.FAILED, ""
        try:
            target = await self._target()
            target.model = target.model or await _first_model(target)
            await self._wait_for_validations()
            await self._db(self.run.refresh_from_db)
            load = self._load_run(target)
            await self._db(self._start_profiles, target)
            state = await load.run()
            if load.bounded_by:
                await self._db(self._note, f"ended at its bound: {load.bounded_by}")
        except Exception as exc:  # the run's failure is its outcome; what it measured stays
            log.exception("load test %s failed", self.run.pk)
            error = f"{type(exc).__name__}: {exc}"
        finally:
            await self._db(self._finish, state, error)
            self.db.shutdown(wait=True)
            self.polls.submit(lambda: connection.close()).result()
            self.polls.shutdown(wait=True)

    async def _wait_for_validations(self) -> None:
        """A node benchmarking its devices would skew both measurements: wait (at most
        ``VALIDATION_WAIT_S``, stoppable) until no node of this array is validating."""
        waited = 0.0
        while waited < VALIDATION_WAIT_S:
            busy = await self._db(self._validating)
            if not busy or await self._db(self._stop_wanted):
                return
            await self._db(self._note, f"waiting: {', '.join(busy)} validating its devices")
            await asyncio.sleep(1.0)
            waited += 1.0

    # --- set-up (database thread) --------------------------------------------------------------

    async def _target(self) -> Target:
        """The target with its token: the run's own, or one minted here, which only this
        control plane, proven (``identity.prove``), may receive; any other target without a
        token ends the run saying so, before any credential exists."""
        url, token = self.run.target_url, self.run.target_token
        if not token or self.run.profile:
            try:
                self.proven = await aprove(url)
            except (NotThisControlPlane, OSError) as exc:
                if not token:
                    raise NotThisControlPlane(
                        f"token: {url} did not prove it is this control plane ({exc}); the run "
                        "mints a token only for this array's own, so give this target a token "
                        "of its own"
                    ) from exc
        if not token:
            token = await self._db(run_token_mint, self.run.pk, rows=self.claim.rows())
            self.minted = True
            url = self.proven.pinned(url)  # type: ignore[union-attr]  (proven to mint)
        return Target(url=url, token=token, model=self.scenario.model)

    async def _prove_again(self) -> None:
        """Before the next step of a run whose token was minted here: the address the token goes
        to must prove again that it is this control plane, else the run ends (a port may change
        hands mid-run). Any of its processes may answer (``up --replicas`` shares one port), so
        the address is what must match, not the pid."""
        if not self.minted or self.proven is None:
            return
        pinned = self.proven.pinned(self.run.target_url)
        try:
            again = await aprove(pinned)
        except NotThisControlPlane as exc:
            raise NotThisControlPlane(
                f"token: {pinned} is no longer this control plane ({exc}); the run stops sending "
                "its token"
            ) from exc
        if again.address != self.proven.address:
            raise NotThisControlPlane(
                f"token: {pinned} answered from {again.address}, not {self.proven.address}; the "
                "run stops sending its token"
            )

    def _load_run(self, target: Target) -> LoadRun:
        return LoadRun(
            self.scenario,
            target,
            run_tag=f"{self.run.pk}.{self.claim.attempt}",
            start_step=len(self.run.steps_done),
            elapsed_s=self.run.elapsed_s,
            requests_before=len(self.run.turns),
            should_stop=self._poll_stop,
            tick=lambda live: self._db(self._tick, live),
            step_done=self._step_end,
            sample_array=_array_sampler(),
        )

    async def _step_end(
        self, step: dict[str, Any], turns: list[dict], sessions: list[dict]
    ) -> None:
        """Keep the step's records, then prove the target again before the next step."""
        await self._db(self._step_done, step, turns, sessions)
        await self._prove_again()

    def _validating(self) -> list[str]:
        from nodes.models import Node

        return list(
            Node.objects.filter(validation=Node.Validation.VALIDATING).values_list(
                "node_id", flat=True
            )
        )

    def _start_profiles(self, target: Target) -> None:
        """Flame graphs of the control plane and the first loopback node, each only when it
        is a process of this array, proved (``profiling.attest_*``), never what a port has."""
        if not self.run.profile:
            return
        from nodes.models import Node

        parts = urlsplit(target.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        node = Node.objects.filter(address__startswith="127.").order_by("node_id").first()
        targets = {
            "control_plane": attest_control_plane(
                self.proven.pid if self.proven else None, f"{parts.hostname}:{port}"
            ),
            "node": attest_node(node.node_id, node.address) if node else "no local node",
        }
        self.profiler = Profiler(Path(settings.VAR_DIR) / "loadtests" / f"run-{self.run.pk}")
        self.profiler.start(targets)

    # --- hooks (database thread) ---------------------------------------------------------------

    def _stop_wanted(self) -> bool:
        rows = self.claim.rows()
        return not rows.exists() or rows.filter(cancel_requested=True).exists()

    def _tick(self, live: dict[str, Any]) -> None:
        LoadTestSample.objects.create(run_id=self.run.pk, t=live["t"], data=live)
        progress = _progress(self.scenario, self.run, live)
        message = (
            f"step {live['step'] + 1} of {live['steps']}: {live['concurrency']} concurrent, "
            f"{live['requests']} requests"
        )
        self.claim.rows().update(
            live=live,
            progress=progress,
            message=message,
            heartbeat_at=timezone.now(),
            elapsed_s=live["t"],
        )
        if self.echo is not None:
            self.echo(f"{progress:6.1%}  {message}")

    def _step_done(self, step: dict[str, Any], turns: list[dict], sessions: list[dict]) -> None:
        run = LoadTestRun.objects.get(pk=self.run.pk)
        self.claim.rows().update(
            steps_done=[*run.steps_done, step],
            turns=[*run.turns, *turns],
            sessions=[*run.sessions, *sessions],
            elapsed_s=step["ended"],
            heartbeat_at=timezone.now(),
        )

    def _note(self, message: str) -> None:
        self.claim.rows().update(message=message[:255], heartbeat_at=timezone.now())

    def _finish(self, state: str, error: str) -> None:
        """Write the report (from every finished step) and the outcome, once, while this
        attempt still holds the run; revoke every token minted for the run, whatever happens
        (only when this attempt ended it: a later attempt's token is that attempt's)."""
        ended = 0
        try:
            self.claim.rows().update(heartbeat_at=timezone.now(), message="writing the report")
            profiles = self.profiler.stop() if self.profiler else {}
            self.claim.rows().update(heartbeat_at=timezone.now())
            run = LoadTestRun.objects.get(pk=self.run.pk)
            ended = self.claim.rows().update(
                state=state,
                report=report_of(run, state, profiles=profiles),
                error=error,
                progress=1.0 if state == State.SUCCEEDED else run.progress,
                message={"succeeded": "done", "stopped": "stopped"}.get(state, error[:255]),
                finished_at=timezone.now(),
            )
        finally:
            if ended:  # else whoever gave up on this attempt revoked them, or will
                run_tokens_revoke(self.run.pk)
            connection.close()


def report_of(run: LoadTestRun, state: str, *, profiles: dict | None = None) -> dict[str, Any]:
    """The report of ``run`` from the records of its finished steps (``report.build_report``)."""
    return build_report(
        scenario=parse_scenario(run.scenario),
        target=run.target_url,
        state=state,
        turns=run.turns,
        sessions=run.sessions,
        steps=run.steps_done,
        samples=list(run.samples.values_list("data", flat=True)),
        costs=CostModel.load().inputs(),
        profiles=profiles or {},
    )


def report_write(run_id: int) -> None:
    """Write the report of a run that ended without its worker (stopped while queued to
    resume, or given up on): what its finished steps measured is kept."""
    run = LoadTestRun.objects.get(pk=run_id)
    LoadTestRun.objects.filter(pk=run_id, report__isnull=True).update(
        report=report_of(run, run.state)
    )


def _progress(scenario: Scenario, run: LoadTestRun, live: dict[str, Any]) -> float:
    """Share of the run done: of the planned time (ramp, steady) or of the planned turns
    (agent sessions), capped by ``max_s``."""
    by_time = live["t"] / scenario.max_s
    if scenario.timed:
        planned = scenario.hold_s * len(scenario.steps)
        return min(1.0, max(by_time, live["t"] / planned))
    planned_turns = sum(c * scenario.turns.mean for c in scenario.steps)
    return min(1.0, max(by_time, live["requests"] / planned_turns))


async def _first_model(target: Target) -> str:
    """The first model the target lists at ``/v1/models`` (a scenario that names none)."""
    try:
        async with direct_client(10.0) as client:
            response = await client.get(
                f"{target.url}/v1/models", headers={"Authorization": f"Bearer {target.token}"}
            )
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise RuntimeError(f"{target.url}/v1/models: {type(exc).__name__}: {exc}") from exc
    models = response.json().get("data") or []
    if not models:
        raise RuntimeError(f"{target.url}/v1/models lists no model (is a node validated and up?)")
    return models[0]["id"]


def _array_sampler():
    """This array's utilization snapshot (``nodes.utilization.take_snapshot``), each node
    with the CPUs it computes on (``cpus``) and, for a node whose process was
    measured on this host, the host's CPU % (``host_cpu``), so the report can tell a node or
    a host out of CPU from one out of memory bandwidth."""
    from asgiref.sync import sync_to_async

    from nodes.utilization import take_snapshot

    async def sample() -> dict[str, Any]:
        snapshot, _ = await take_snapshot(0, None)
        budgets = await sync_to_async(node_cpus, thread_sensitive=False)()
        host_cpu = (snapshot.get("host") or {}).get("cpu")
        for node_id, n in (snapshot.get("nodes") or {}).items():
            n["cpus"] = budgets.get(node_id)
            n["host_cpu"] = host_cpu if n.get("cpu") is not None else None
        return snapshot

    return sample


def node_cpus() -> dict[str, int]:
    """``{node_id: CPUs}``: the threads each node computes with, no more than the CPUs of its
    CPU set when it has one (a node with 1 thread uses one CPU however many it may run on)."""
    from nodes.models import Node
    from nodes.validation_machines import cpu_set_of

    close_old_connections()
    out = {}
    for node_id, cpu_set, threads in Node.objects.values_list("node_id", "cpu_set", "threads"):
        pinned = cpu_set_of(cpu_set)
        out[node_id] = max(1, min(threads or 1, len(pinned) if pinned else threads or 1))
    return out


# --- the control loop's side -------------------------------------------------------------------


def loadtests_tick() -> None:
    """Give up on runs whose worker died (queue them again to resume, or fail them), then
    start the oldest queued run when none is running."""
    close_old_connections()
    light = ("pk", "state", "attempts", "cancel_requested", "heartbeat_at", "started_at")
    for run in LoadTestRun.objects.filter(state=State.RUNNING).only(*light):
        if not _alive(run):
            _worker_gone(run)
    PROCESSES.reap(keep=lambda pk: False)
    if LoadTestRun.objects.filter(state=State.RUNNING).exists():
        return
    queued = LoadTestRun.objects.filter(state=State.QUEUED).order_by("created_at", "id")
    run = queued.only("pk").first()
    if run is not None:
        _start(run)


def _alive(run: LoadTestRun) -> bool:
    """The run's worker still works: it beat within ``LOADTEST_STALE_S``, and, when this loop
    started it, its process has not exited. A worker of ours that stopped beating is hung."""
    if PROCESSES.exited(run.pk):
        return False
    return beat_is_fresh(run.heartbeat_at or run.started_at, settings.LOADTEST_STALE_S)


def _worker_gone(run: LoadTestRun) -> None:
    """End the run (stopped, or failed after ``MAX_ATTEMPTS``) with the report of what it
    measured, or queue it again to resume after its last finished step."""
    PROCESSES.kill(run.pk, grace_s=0)  # a worker of ours that no longer beats is hung
    rows = LoadTestRun.objects.filter(pk=run.pk, state=State.RUNNING, attempts=run.attempts)
    if run.cancel_requested or run.attempts >= MAX_ATTEMPTS:
        why = "stopped" if run.cancel_requested else f"its worker stopped {run.attempts} times"
        ended = rows.update(
            state=State.STOPPED if run.cancel_requested else State.FAILED,
            error="" if run.cancel_requested else why,
            message=why,
            finished_at=timezone.now(),
        )
        if ended:
            run_tokens_revoke(run.pk)
            report_write(run.pk)
        return
    if rows.update(state=State.QUEUED, pid=None, message="its worker stopped; it resumes"):
        run_tokens_revoke(run.pk)  # the dead attempt's token dies with it; the next mints anew


def _start(run: LoadTestRun) -> None:
    if not _claim(run.pk, pid=None):
        return
    attempt = LoadTestRun.objects.values_list("attempts", flat=True).get(pk=run.pk)  # ours now
    try:  # the same database as this process (child_environment)
        child = PROCESSES.start(run.pk, attempt=attempt)
    except OSError as exc:
        LoadTestRun.objects.filter(pk=run.pk).update(
            state=State.FAILED,
            error=f"the worker could not start: {exc}",
            finished_at=timezone.now(),
        )
        return
    Lease(LoadTestRun, run.pk, attempt).rows().update(pid=child.pid)
