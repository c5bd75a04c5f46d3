"""The embedded array serves the quantization type that runs fastest on this CPU.

``manage.py up`` starts its nodes on the bundled file (SmolLM2-135M-Instruct Q4_1) at once, and
on its first start (``serving_default_start``) times each candidate type here
(``serving_type.measure_types``: the decode step of 1 and of 8 tokens). The types that serve
more tokens/s at 8 streams than the bundled one (by ``serving_type.MIN_GAIN``), fastest first
(``serving_type.faster_than``), are the candidates, and the pipeline any operator would run is
queued on the project's one job mechanism (package jobs, run by the control loop):

1. an **evaluation of the bundled version**, unless it has a complete one, as a baseline (its
   figures are kept; not a verdict: its status does not move);
2. a **build** of the first candidate from the bundled package (``method: f16``), its lineage
   naming the bundled version and why (``lineage.reason``, the figures);
3. its **evaluation**, gated against the bundled version it would replace
   (``gate.gate_check``'s ``replacing``: no worse than what the nodes serve now, within the
   family's allowed drop); rejected: back to 2 with the next candidate, if any;
4. once one is approved, an **upgrade** of the nodes serving the bundled version to it (a
   rolling upgrade with its drain, bake and rollback, on the Upgrades page).

Each step is queued by the one before as it succeeds (the job's params: ``then``,
``candidates`` left, ``replaces``; ``serving_default_next``); a job that fails stops the chain
where it is, visible on the Packages page, and the nodes go on serving the bundled file. The
step taken is the last line of each job's log. The chain is started once per database: a later
``up`` sees its jobs and queues nothing. ``PHALANX_SERVING_TYPE=bundled`` (the test suite's
setting) skips it all.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from console.lib.errors import ConsoleError
from inference.model_names import family_of
from inference.models import ModelPackage, PackageJob
from inference.packages.serving_type import faster_than, measure_types

log = logging.getLogger(__name__)
THEN = "serve"  # a package job's ``then`` param: the chain above
ENV_SERVING_TYPE = "PHALANX_SERVING_TYPE"  # "auto" (default) or "bundled"


def serving_default_start(bundled: ModelPackage, *, threads: int) -> str:
    """Time the candidate types for ``bundled`` with ``threads`` threads (a node's) and queue
    the chain when one is faster; returns the sentence ``up`` prints."""
    if os.environ.get(ENV_SERVING_TYPE, "auto") == "bundled":
        return f"serving type: {bundled.quantization} (the bundled file; ${ENV_SERVING_TYPE})"
    if PackageJob.objects.filter(params__then=THEN).exists():
        return "serving type: chosen at the first start (the Packages page has its jobs)"
    own = bundled.quantization.upper()
    speeds = measure_types(Path(bundled.gguf_path), threads=threads)
    figures = ", ".join(
        f"{s.quantization} {s.tokens_per_s_8:.0f}"
        for s in sorted(speeds, key=lambda s: -s.tokens_per_s_8)
    )
    why = f"tok/s at 8 streams, {threads} thread(s): {figures}"
    candidates = [s.quantization for s in faster_than(speeds, own)]
    if not candidates:
        return f"serving type: {own}, the fastest here ({why})"
    chain = {"then": THEN, "candidates": candidates, "reason": f"fastest on this CPU ({why})"}
    said = f"serving type: {candidates[0]} is {chain['reason']}: "
    if not (bundled.gate or {}).get("complete"):
        from inference.packages.services import package_evaluate_enqueue

        job = package_evaluate_enqueue(package_id=bundled.pk, then={**chain, "baseline": True})
        said += f"queued an evaluation of {bundled.key} as the baseline (job {job.pk}), then "
    else:
        job = _queue_build(bundled, chain)
        if job is None:
            return said + "a version of that type exists already; nothing queued"
        said += f"queued (job {job.pk}) "
    return said + (
        "a build of it, its evaluation against the bundled version, and an upgrade of the "
        "nodes once it passes (until then they serve the bundled file)"
    )


def _queue_build(source: ModelPackage, chain: dict[str, Any]) -> PackageJob | None:
    """The build of ``chain``'s first candidate from ``source`` (the rest carried on); None
    when a version of that name exists already (an operator's: the chain stops)."""
    from inference.packages.services import package_build_enqueue

    first, *rest = chain["candidates"]
    name = f"{source.family or family_of(source.name)}-{first.lower()}"
    if ModelPackage.objects.filter(name=name).exists():
        return None
    return package_build_enqueue(
        package_id=source.pk,
        quantization=first,
        name=name,
        then={**_carried(chain), "candidates": [first, *rest]},
    )


def _carried(params: dict[str, Any]) -> dict[str, Any]:
    return {k: params[k] for k in ("then", "candidates", "reason") if k in params}


def serving_default_next(job: PackageJob) -> str:
    """The chain's next step after ``job`` (one with ``then``) succeeded; returns what was
    done, for the job's log. A step that cannot be taken (no node serves the source any more,
    an upgrade is under way) is said, not raised: the job itself succeeded."""
    try:
        if job.kind == PackageJob.Kind.BUILD:
            return _evaluate_built(job)
        if job.params.get("baseline"):
            return _build_next(job.package, {**_carried(job.params)})
        return _after_verdict(job)
    except ConsoleError as exc:
        return f"next: none ({exc})"


def _evaluate_built(job: PackageJob) -> str:
    from inference.packages.services import package_evaluate_enqueue

    built = job.output
    rest = job.params["candidates"][1:]
    then = {**_carried(job.params), "candidates": rest, "replaces": job.package_id}
    queued = package_evaluate_enqueue(package_id=built.pk, then=then)
    return f"next: evaluation of {built.key} against {job.package.key} (job {queued.pk})"


def _build_next(source: ModelPackage, chain: dict[str, Any]) -> str:
    if not chain.get("candidates"):
        return "next: none, no faster type is left to try (the nodes keep their version)"
    queued = _queue_build(source, chain)
    if queued is None:
        return f"next: none, a {chain['candidates'][0]} version exists already"
    return f"next: build of {chain['candidates'][0]} (job {queued.pk})"


def _after_verdict(job: PackageJob) -> str:
    from inference.upgrades.services import upgrade_start

    package = ModelPackage.objects.get(pk=job.package_id)
    source = ModelPackage.objects.get(pk=job.params["replaces"])
    if package.status != ModelPackage.Status.APPROVED:
        said = f"{package.key} is {package.status}; "
        return said + _build_next(source, _carried(job.params)).removeprefix("next: ")
    upgrade = upgrade_start(from_package_id=source.pk, to_package_id=package.pk)
    return f"next: upgrade {upgrade.pk} of {upgrade.model} to {package.key}"
