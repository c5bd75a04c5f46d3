"""The quantization type the embedded array serves: timed per type on this CPU, the fastest
at 8 streams built, evaluated and rolled out through the package pipeline (issue 34, item 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference.engine import tuning
from inference.models import ModelPackage, PackageJob
from inference.packages import jobs, services, serving_default, serving_type
from inference.packages.serving_type import TypeSpeed, fastest
from inference.upgrades.models import Upgrade
from nodes.services import node_upsert
from tests.inference.packages.test_jobs import source


def speed(name: str, one_ms: float, eight_ms: float) -> TypeSpeed:
    return TypeSpeed(name, one_ms, eight_ms, 1)


def test_the_pick_is_the_most_tokens_per_second_at_8_streams_not_the_best_gain() -> None:
    q8 = speed("Q8_0", 7.0, 26.0)  # gain 2.15, 308 tok/s at 8
    q4_0 = speed("Q4_0", 5.4, 23.0)  # gain 1.88, 348 tok/s at 8
    q4_1 = speed("Q4_1", 7.2, 35.5)  # 225 tok/s at 8
    assert q8.batch_gain > q4_0.batch_gain
    assert fastest([q8, q4_0, q4_1], "Q4_1") == q4_0
    # within TIE of the best at 8 streams, the faster single stream wins
    q8_ahead = speed("Q8_0", 7.0, 23.0 / (serving_type.TIE - 0.03))
    assert q8_ahead.tokens_per_s_8 > q4_0.tokens_per_s_8
    assert fastest([q8_ahead, q4_0, q4_1], "Q4_1") == q4_0
    q8_far_ahead = speed("Q8_0", 7.0, 23.0 / (serving_type.TIE + 0.05))
    assert fastest([q8_far_ahead, q4_0, q4_1], "Q4_1") == q8_far_ahead
    # the source's own type stays unless beaten by MIN_GAIN
    close = speed("Q4_0", 7.0, 35.5 / (serving_type.MIN_GAIN - 0.02))
    assert fastest([q4_1, close], "Q4_1") == q4_1
    with pytest.raises(ValueError):
        fastest([], "Q4_1")


@pytest.mark.model
def test_types_are_timed_on_the_real_model_and_remembered(bundled, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    timed = serving_type.measure_types(bundled, threads=2, candidates=("Q4_1", "Q4_0"))
    by_type = {s.quantization: s for s in timed}
    assert set(by_type) == {"Q4_1", "Q4_0"}
    assert by_type["Q4_1"].size_bytes == bundled.stat().st_size  # its own file, not remade
    assert by_type["Q4_0"].size_bytes < by_type["Q4_1"].size_bytes  # 4.5 vs 5 bits a weight
    for s in timed:  # (how they compare depends on the CPU: docs/packages.md has figures)
        assert s.step_1_ms > 0 and s.step_8_ms > 0, s
    assert not list(tmp_path.glob("serving-type-*"))

    def never(*args, **kwargs):
        raise AssertionError("timed again")

    monkeypatch.setattr(serving_type, "quantize", never)
    assert serving_type.measure_types(bundled, threads=2, candidates=("Q4_1", "Q4_0")) == timed
    # another build of llama.cpp (the same version with other instruction sets) times again
    monkeypatch.setattr(tuning, "llama_build", lambda: "0.3.36 CPU : AVX2 = 0 | ")
    with pytest.raises(AssertionError, match="timed again"):
        serving_type.measure_types(bundled, threads=2, candidates=("Q4_1", "Q4_0"))


@pytest.fixture
def bundled_package(home, bundled) -> ModelPackage:
    return source(bundled)


def timed_as(monkeypatch, speeds: list[TypeSpeed]) -> None:
    """``measure_types`` gives ``speeds``; the chain is on (the suite's nodes serve the
    bundled file: tests/conftest.py)."""
    monkeypatch.setattr(serving_default, "measure_types", lambda path, threads: speeds)
    monkeypatch.setenv(serving_default.ENV_SERVING_TYPE, "auto")


def scores(accuracy: float, schema: float = 0.9, perplexity: float = 30.0) -> dict:
    """An evaluation report's gated figures (the evaluation itself: test_eval_runner)."""
    return {
        "smoke": {"passed": True, "error": "", "steps": []},
        "modes": {"grammar": {"tool_accuracy": accuracy, "schema_valid_rate": schema}},
        "perplexity": perplexity,
    }


def evaluated(job: PackageJob, report: dict) -> PackageJob:
    """``job`` (an evaluation) as if it ran: its figures recorded the way the job records
    them, the job succeeded; the chain's next step is the return of ``serving_default_next``."""
    replaces = job.params.get("replaces")
    services.package_mark_evaluating(job.package)
    services.package_record_evaluation(
        package_id=job.package_id,
        report=report,
        verdict=not job.params.get("baseline"),
        replacing=ModelPackage.objects.get(pk=replaces) if replaces else None,
    )
    PackageJob.objects.filter(pk=job.pk).update(state="succeeded")
    return PackageJob.objects.get(pk=job.pk)


@pytest.mark.django_db
def test_a_faster_type_is_built_evaluated_against_the_bundled_one_then_rolled_out(
    bundled_package, monkeypatch
) -> None:
    node_upsert(node_id="n1", address="127.0.0.1:1", package_id=bundled_package.pk)
    timed_as(
        monkeypatch,
        [speed("Q4_1", 7.2, 35.5), speed("Q4_0", 5.4, 23.0), speed("Q8_0", 7.0, 26.0)],
    )
    said = serving_default.serving_default_start(bundled_package, threads=1)
    baseline = PackageJob.objects.get()
    assert baseline.kind == "evaluate" and baseline.package == bundled_package
    assert baseline.params["baseline"] and baseline.params["candidates"] == ["Q4_0", "Q8_0"]
    assert "Q4_0 is fastest on this CPU" in said and f"job {baseline.pk}" in said, said
    # a second start queues nothing
    assert "first start" in serving_default.serving_default_start(bundled_package, threads=1)

    # the bundled version's figures: below the family's floor (0.5), kept, not a verdict
    said = serving_default.serving_default_next(evaluated(baseline, scores(0.25)))
    bundled_package.refresh_from_db()
    assert bundled_package.status == "draft" and "not a verdict" in bundled_package.gate["summary"]
    build = PackageJob.objects.get(kind="build")
    assert said == f"next: build of Q4_0 (job {build.pk})"

    done = jobs.job_execute(build.pk)  # the real build: Q4_1 -> F16 -> Q4_0, then the next step
    assert done.state == "succeeded", done.error
    built = done.output
    assert built.quantization == "Q4_0" and built.parent == bundled_package
    assert built.lineage["from"] == bundled_package.key
    assert "fastest on this CPU" in built.lineage["reason"]
    evaluation = PackageJob.objects.get(kind="evaluate", package=built)
    assert evaluation.params["replaces"] == bundled_package.pk
    assert evaluation.params["candidates"] == ["Q8_0"]
    assert done.log.endswith(f"(job {evaluation.pk})")

    # more than the allowed drop below the bundled version: rejected, the next type is built
    said = serving_default.serving_default_next(evaluated(evaluation, scores(0.19)))
    built.refresh_from_db()
    assert built.status == "rejected", built.gate["summary"]
    assert "tool accuracy 0.19 against the replaced 0.25" in built.gate["summary"]
    assert said.startswith(f"{built.key} is rejected; build of Q8_0 (job ")
    assert not Upgrade.objects.exists()

    # within it: approved against the bundled version, and the nodes roll to it
    q8 = PackageJob.objects.get(kind="build", params__quantization="Q8_0")
    q8_built = services.package_register_built(
        source=bundled_package,
        path=Path(built.gguf_path),
        name="smollm2-135m-instruct-q8_0",
        version="1",
        report={"requested": "Q8_0", "method": "f16"},
    )  # the file does not matter here; the chain's params do
    PackageJob.objects.filter(pk=q8.pk).update(state="succeeded", output=q8_built)
    said = serving_default.serving_default_next(PackageJob.objects.get(pk=q8.pk))
    last = PackageJob.objects.get(kind="evaluate", package=q8_built)
    assert last.params["candidates"] == [] and last.params["replaces"] == bundled_package.pk
    said = serving_default.serving_default_next(evaluated(last, scores(0.22, schema=0.86)))
    q8_built.refresh_from_db()
    assert q8_built.status == "approved", q8_built.gate["summary"]
    upgrade = Upgrade.objects.get()
    assert (upgrade.from_package, upgrade.to_package) == (bundled_package, q8_built)
    assert said == f"next: upgrade {upgrade.pk} of {upgrade.model} to {q8_built.key}"


@pytest.mark.django_db
def test_the_bundled_type_stays_when_it_is_the_fastest_or_when_asked(
    bundled_package, monkeypatch
) -> None:
    timed_as(monkeypatch, [speed("Q4_1", 5.0, 20.0), speed("Q4_0", 5.4, 23.0)])
    said = serving_default.serving_default_start(bundled_package, threads=1)
    assert said.startswith("serving type: Q4_1, the fastest here"), said
    timed_as(monkeypatch, [speed("Q4_1", 7.2, 35.5), speed("Q4_0", 5.4, 23.0)])
    monkeypatch.setenv(serving_default.ENV_SERVING_TYPE, "bundled")
    assert "bundled file" in serving_default.serving_default_start(bundled_package, threads=1)
    assert not PackageJob.objects.exists()
