"""Package jobs on the real model: quantization builds, cancelling one (nothing is left), a
job process that dies is run again, broken chat templates rejected at the smoke stage."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from django.test import Client

from inference.models import ModelPackage, PackageJob
from inference.packages import jobs, services

pytestmark = [pytest.mark.model, pytest.mark.e2e]


def until(predicate, timeout: float = 120.0, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"not true within {timeout}s: {predicate}")


def source(bundled) -> ModelPackage:
    return services.package_import_file(
        path=bundled,
        name="smollm2-135m-instruct-q4_1",
        version="1",
        source={"kind": "import", "from": "test"},
    ).package


def job(pk: int) -> PackageJob:
    return PackageJob.objects.get(pk=pk)


def stored_files(home: Path) -> set[str]:
    return {p.name for p in (home / "packages" / "sha256").glob("*/*.gguf")}


@pytest.mark.django_db
def test_it_quantizes_the_real_model_into_two_types(home, bundled):
    src = source(bundled)
    # the second build requantizes: the job passes the method on (and skips a second
    # dequantization to F16, which tests/inference/packages/test_build.py covers)
    for target, method in (("Q8_0", "f16"), ("Q4_0", "requantize")):
        queued = services.package_build_enqueue(
            package_id=src.pk, quantization=target, method=method
        )
        done = jobs.job_execute(queued.pk)
        assert done.state == "succeeded", done.error
        built = done.output
        assert built.key == f"smollm2-135m-instruct-{target.lower()}:1"
        assert built.quantization == target and built.parent == src
        assert built.lineage["requested"] == target and built.lineage["method"] == method
        assert built.build_report["tensor_types"] == built.tensor_types
        assert max(built.tensor_types, key=built.tensor_types.get) == target  # mostly that type
        assert Path(built.gguf_path).is_file() and built.status == "draft"
        assert "done" == done.message and done.progress == 1.0
    assert not (home / "packages" / "work" / f"job-{queued.pk}").exists()


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_build_leaves_nothing_behind(home, bundled):
    src = source(bundled)
    before = stored_files(home)
    queued = services.package_build_enqueue(package_id=src.pk, quantization="Q8_0")
    jobs.jobs_tick()  # the control loop starts it in its own process
    running = until(lambda: (j := job(queued.pk)).progress > 0.02 and j)
    assert running.state == "running" and running.pid
    services.job_cancel(job_id=queued.pk)
    jobs.jobs_tick()
    cancelled = job(queued.pk)
    assert cancelled.state == "cancelled" and cancelled.finished_at
    with pytest.raises(ProcessLookupError):
        os.kill(running.pid, 0)
    assert ModelPackage.objects.count() == 1
    assert stored_files(home) == before
    assert not (home / "packages" / "work" / f"job-{queued.pk}").exists()


@pytest.mark.django_db(transaction=True)
def test_a_job_whose_process_died_runs_again_from_the_start(home, bundled):
    src = source(bundled)
    # requantized (no F16 copy first): the subject is the run again, not the method
    queued = services.package_build_enqueue(
        package_id=src.pk, quantization="Q8_0", method="requantize"
    )
    jobs.jobs_tick()
    first = until(lambda: (j := job(queued.pk)).progress > 0.02 and j)
    os.killpg(first.pid, signal.SIGKILL)  # as a machine restart would
    until(lambda: not jobs._alive(job(queued.pk)))
    jobs.jobs_tick()  # the dead run is queued again, and started again in the same tick
    again = job(queued.pk)
    assert again.state == "running" and again.attempts == 2 and again.pid != first.pid
    assert "stopped before the end; it will run again" in again.log

    def finished():
        jobs.jobs_tick()
        return job(queued.pk).finished

    until(finished, timeout=240, step=1.0)
    done = job(queued.pk)
    assert done.state == "succeeded", done.error
    assert done.output.quantization == "Q8_0"


BROKEN = {
    "unknown-tag": ("{% frobnicate %}{{ messages }}", "frobnicate"),
    "undefined-function": (
        "{% for m in messages %}{{ undefined_helper(m['content']) }}{% endfor %}",
        "undefined_helper",
    ),
}


@pytest.mark.django_db
@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_broken_chat_template_is_rejected_at_the_smoke_stage(home, bundled, kind, admin_user):
    template, words = BROKEN[kind]
    broken = services.package_with_template(package_id=source(bundled).pk, chat_template=template)
    queued = services.package_evaluate_enqueue(package_id=broken.pk, subset=4)
    done = jobs.job_execute(queued.pk)
    assert done.state == "succeeded", done.error
    broken.refresh_from_db()
    assert broken.status == "rejected"
    assert broken.status_reason.startswith("failed: smoke test failed:")
    assert words in broken.status_reason
    assert broken.evaluation["modes"] in ({}, None) or not broken.evaluation.get("modes")
    client = Client()
    client.force_login(admin_user)
    page = client.get(f"/packages/{broken.pk}/").content.decode()
    # the error the smoke test saw, not the template text the page also shows
    smoke_error = page.split('id="smoke-error"', 1)[1].split("</div>", 1)[0]
    assert words in smoke_error and "rejected" in page.lower()
