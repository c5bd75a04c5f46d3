"""The package lifecycle's operations, as pages, the API and commands call them: import a
file, derive a version with a chat template, register a build, queue builds, evaluations and
imports, record an evaluation under the gate, approve, reject, retire, delete, cancel a job.
Every change is audited (``console.lib.audit``). What they are made of lives beside them:
getting a GGUF into the store (``intake.py``), version names (``naming.py``), status moves
(``status_moves.py``), a family's gate limits and baseline (``gate_policy.py``).

Errors (``console.lib.errors``): ``Invalid`` (a field, 422), ``BadFile`` (not a GGUF, 400),
``NotFound``, ``Conflict`` (a status move that is not allowed, a version that exists, a
package that may not be deployed: 409).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import transaction
from django.db.models import ProtectedError
from django.utils import timezone

from console.lib.audit import audit_record
from console.lib.errors import Conflict, Invalid, NotFound
from inference.model_names import family_of
from inference.models import ModelPackage, PackageJob
from inference.packages import gate as gates
from inference.packages.gate_policy import approved_baseline, policy_for
from inference.packages.import_paths import check_import_path
from inference.packages.intake import (
    check_magic,
    open_source,
    package_store,
    scratch_space,
    store_source,
    with_template,
)
from inference.packages.naming import check_name, check_version_free, next_version
from inference.packages.registry import BadFile, check_chat_template
from inference.packages.registry import register as _register
from inference.packages.registry import stored_fields as _stored_fields
from inference.packages.retention import file_unused, unless_registered
from inference.packages.status_moves import package_evaluation_ended, status_move
from inference.packages.store import Stored

Status = ModelPackage.Status


@dataclass
class Imported:
    """What an import made: the package, whether it is new, warnings for the operator."""

    package: ModelPackage
    created: bool
    warnings: list[str] = field(default_factory=list)


def package_get(package_id: int) -> ModelPackage:
    package = ModelPackage.objects.filter(pk=package_id).first()
    if package is None:
        raise NotFound(f"No package {package_id}.", code="package_not_found")
    return package


def _read_facts(path: Path):
    from inference.packages.gguf_files import NotGguf, read_facts

    try:
        return read_facts(path)
    except NotGguf as exc:
        raise BadFile(str(exc)) from exc


def package_import_file(
    *,
    path: Path,
    name: str,
    version: str | None = None,
    family: str | None = None,
    source: dict[str, Any],
    chat_template: str | None = None,
    workdir: Path | None = None,
) -> Imported:
    """Store the GGUF at ``path`` and register it as draft ``name:version``; returns the
    package, whether it is new, and warnings for the operator (no chat template).

    A GGUF without a template becomes a completion-only package unless ``chat_template`` is
    given, which is then written into a copy of the file (``tokenizer.chat_template``): the
    package is still one exact file. A template given for a GGUF that has one replaces it.
    A path ``check_import_path`` gave (``ImportPath``) is checked again on the file opened
    (``import_paths.open_import``) and read only through that open file.
    Idempotent: the same file under the same name:version returns the existing package.
    Raises ``BadFile``, ``Invalid``, ``Conflict`` (name:version exists with another file).
    """
    store = package_store()
    with open_source(path) as handle:
        check_magic(handle, path)
        version = version or next_version(name)
        check_name(name, version)
        stored, template_source = store_source(store, path, handle, chat_template, workdir)
    warnings: list[str] = []
    with unless_registered(stored, store):
        facts = _read_facts(stored.path)  # the stored bytes, not a source that may change
        if template_source == ModelPackage.TemplateSource.GGUF and not facts.chat_template:
            template_source = ModelPackage.TemplateSource.NONE
            warnings.append(
                "This GGUF has no chat template: the package is completion-only and nodes "
                "refuse chat completions for it. Give a chat template (the model's turn "
                "format) to make a chat version."
            )
        package, created = _register(
            name=name,
            version=version,
            family=family or family_of(name),
            **_stored_fields(stored),
            facts=facts,
            template_source=template_source,
            lineage={**source, "template": template_source},
            parent=None,
        )
    return Imported(package, created, warnings)


def package_with_template(
    *, package_id: int, chat_template: str, version: str | None = None
) -> ModelPackage:
    """A new draft version of ``package_id`` whose GGUF carries ``chat_template`` (an
    operator-supplied template for a GGUF without one, or a corrected one). Raises
    ``Invalid`` (empty template), ``NotFound``."""
    if not chat_template.strip():
        raise Invalid("chat_template: give the template text (Jinja).", field="chat_template")
    check_chat_template(chat_template)
    source = package_get(package_id)
    package_check_chat(source, doing="a chat template")
    version = version or next_version(source.name)
    check_name(source.name, version)
    store = package_store()
    with store.hold(source.sha256), scratch_space(None) as scratch:  # the source stays meanwhile
        stored = store.add_file(with_template(Path(source.gguf_path), chat_template, scratch))
    with unless_registered(stored, store):
        facts = _read_facts(stored.path)
        package = _register_with_template(source, stored, facts, version)
    return package


def _register_with_template(
    source: ModelPackage, stored: Stored, facts: Any, version: str
) -> ModelPackage:
    package, _ = _register(
        name=source.name,
        version=version,
        family=source.family or family_of(source.name),
        **_stored_fields(stored),
        facts=facts,
        template_source=ModelPackage.TemplateSource.OPERATOR,
        lineage={"kind": "template", "from": source.key, "from_id": source.pk},
        parent=source,
    )
    return package


def package_register_built(
    *,
    source: ModelPackage,
    path: Path,
    name: str,
    version: str,
    report: dict[str, Any],
    reason: str = "",
) -> ModelPackage:
    """Store a quantizer's output and register it as a draft built from ``source``; ``reason``
    (why it was built, when not by hand) goes into its lineage."""
    store = package_store()
    stored = store.add_file(path)
    with unless_registered(stored, store):
        facts = _read_facts(stored.path)
        package, _ = _register(
            name=name,
            version=version,
            family=source.family or family_of(source.name),
            **_stored_fields(stored),
            facts=facts,
            template_source=source.template_source,
            lineage={
                "kind": "build",
                "from": source.key,
                "from_id": source.pk,
                "requested": report.get("requested"),
                "method": report.get("method"),
                **({"reason": reason} if reason else {}),
            },
            parent=source,
            build_report=report,
        )
    return package


def package_mark_evaluating(package: ModelPackage) -> str:
    """Move ``package`` to ``evaluating`` while an evaluation job runs (from draft or
    rejected); returns the status it had, which ``package_evaluation_ended`` restores when the
    evaluation ends without a verdict. Raises ``Conflict`` for an approved or retired
    version."""
    before = package.status
    if before != Status.EVALUATING:
        status_move(package, Status.EVALUATING)
    return before


@transaction.atomic
def package_approve(*, package_id: int, override_reason: str = "") -> ModelPackage:
    """Approve a version whose evaluation passed the gate; one that did not (or was never
    evaluated) only with ``override_reason``, which is recorded. Raises ``Conflict`` (the
    gate has not passed and no reason was given, or the status does not allow it)."""
    package = package_get(package_id)
    gate = package.gate or {}
    passed = bool(gate.get("passed")) and gate.get("complete", True)
    if not passed and not override_reason.strip():
        why = gate.get("summary") or "it has not been evaluated"
        raise Conflict(
            f"{package.key} has not passed the gate ({why}); approving it needs an "
            "override reason.",
            code="gate_not_passed",
        )
    reason = "gate passed" if passed else f"override: {override_reason.strip()}"
    return status_move(package, Status.APPROVED, reason)


@transaction.atomic
def package_reject(*, package_id: int, reason: str) -> ModelPackage:
    """Reject a version by hand. Raises ``Invalid`` (no reason), ``Conflict``."""
    if not reason.strip():
        raise Invalid("reason: say why the version is rejected.", field="reason")
    return status_move(package_get(package_id), Status.REJECTED, reason.strip())


@transaction.atomic
def package_retire(*, package_id: int) -> ModelPackage:
    """Retire a version: no node may be given it again. Raises ``Conflict`` while nodes
    serve it."""
    package = package_get(package_id)
    if package.nodes.exists():
        raise Conflict(f"{package.key} is served by nodes; move them first.", code="package_in_use")
    return status_move(package, Status.RETIRED)


def package_delete(*, package_id: int) -> None:
    """Delete a version and, when no other version shares it, its file. Raises
    ``NotFound``; ``Conflict`` when nodes serve it, when it is approved (the record of what
    was proven: retire it instead), or while a job of it is queued or running."""
    package = package_get(package_id)
    if package.status == Status.APPROVED:
        raise Conflict(
            f"{package.key} is approved; retire it instead (an approved version is the record "
            "of what was proven).",
            code="package_approved",
        )
    if package.jobs.filter(state__in=[PackageJob.State.QUEUED, PackageJob.State.RUNNING]).exists():
        raise Conflict(
            f"{package.key} has a queued or running job; cancel it first.", code="job_exists"
        )
    try:
        package.delete()
    except ProtectedError as exc:
        raise Conflict(
            f"{package.key} is served by nodes; move them first.", code="package_in_use"
        ) from exc
    store = package_store()
    if store.holds(package.gguf_path):  # a file of the store, and only when nobody holds it
        file_unused(store, package.sha256)
    audit_record(action="package.remove", target=package.key)


def package_check_chat(package: ModelPackage, *, doing: str, field: str = "package_id") -> None:
    """Raise ``Invalid`` (422, code ``package_embedding``, naming ``field``) when ``package``
    is an embedding package: those run in the control plane (``/v1/embeddings``, the semantic
    cache), so ``doing`` (a node, an upgrade, a chat evaluation, a build) needs a chat one."""
    if package.kind == ModelPackage.Kind.EMBEDDING:
        raise Invalid(
            f"{field}: {package.key} is an embedding model (run by the control plane for "
            f"/v1/embeddings and the semantic cache); {doing} needs a chat model.",
            field=field,
            code="package_embedding",
        )


def package_check_deployable(package: ModelPackage) -> None:
    """Raise ``Conflict`` (409) naming why a node may not be given ``package``: rejected
    (with the failed criteria), being evaluated, or retired; ``Invalid`` (422) for an
    embedding package (``package_check_chat``)."""
    package_check_chat(package, doing="a node")
    if package.status == Status.REJECTED:
        raise Conflict(
            f"{package.key} is rejected ({package.status_reason or 'failed its gate'}); "
            "it cannot be deployed.",
            code="package_rejected",
            field="package_id",
        )
    if package.status == Status.EVALUATING:
        raise Conflict(
            f"{package.key} is being evaluated; it can be deployed once the evaluation ends.",
            code="package_evaluating",
            field="package_id",
        )
    if package.status == Status.RETIRED:
        raise Conflict(
            f"{package.key} is retired; it cannot be deployed.",
            code="package_retired",
            field="package_id",
        )


# --- gate -----------------------------------------------------------------------------------


@transaction.atomic
def package_record_evaluation(
    *,
    package_id: int,
    report: dict[str, Any],
    complete: bool = True,
    status_before: str = Status.DRAFT,
    verdict: bool = True,
    replacing: ModelPackage | None = None,
) -> gates.GateResult:
    """Keep an evaluation report on the version and apply the gate: a pass approves it, a
    fail rejects it with the failed criteria named.

    Only a ``complete`` evaluation (the whole suite) is a verdict: a partial one (a subset of
    cases) keeps its figures and gate result, marked partial, and puts the version back to
    ``status_before`` -- unless its smoke test failed, which rejects whatever the subset (the
    smoke test is the same in every evaluation). A version someone approved, rejected or retired while it was being
    evaluated keeps that status (the figures are still kept). ``verdict=False``: figures
    taken as a baseline (``serving_default``), kept like a partial evaluation's. ``replacing``:
    the version this one would replace, compared with instead of the approved one
    (``gate.gate_check``'s ``replacing``)."""
    package = ModelPackage.objects.select_for_update().get(pk=package_id)
    baseline = replacing if replacing is not None else approved_baseline(package)
    result = gates.gate_check(
        report,
        policy_for(package.family),
        baseline.evaluation if baseline else None,
        baseline.key if baseline else "",
        replacing=replacing is not None,
    )
    summary = result.summary()
    smoke_failed = not (report.get("smoke") or {}).get("passed")
    complete = complete or smoke_failed  # the smoke test is whole in any evaluation
    if not complete:
        cases = (report.get("suite") or {}).get("cases", "some")
        summary = f"{summary} on a partial evaluation ({cases} cases): not a verdict"
    elif not verdict:
        summary = f"{summary}; measured as the baseline of a serving-type choice: not a verdict"
    package.evaluation = report
    package.gate = {**result.as_dict(), "summary": summary, "complete": complete and verdict}
    package.evaluated_at = timezone.now()
    package.save(update_fields=["evaluation", "gate", "evaluated_at"])
    if not complete or not verdict:
        package_evaluation_ended(package_id=package.pk, status_before=status_before, why=summary)
    elif package.status in (Status.DRAFT, Status.EVALUATING):
        if package.status == Status.DRAFT:
            status_move(package, Status.EVALUATING)
        status_move(package, Status.APPROVED if result.passed else Status.REJECTED, summary)
    return result


# --- jobs -----------------------------------------------------------------------------------


def job_enqueue(*, kind: str, package: ModelPackage | None, params: dict[str, Any]) -> PackageJob:
    """A queued job row; the control loop starts it in its own process."""
    from console.lib.audit import current_actor

    job = PackageJob.objects.create(
        kind=kind, package=package, params=params, created_by=current_actor()[:150]
    )
    audit_record(
        action=f"package.{kind}",
        target=package.key if package else params.get("requirement") or params.get("path", ""),
        changes=[f"job {job.pk} queued"] + [f"{k}: {v}" for k, v in params.items()],
    )
    return job


def package_build_enqueue(
    *,
    package_id: int,
    quantization: str,
    method: str = "f16",
    name: str | None = None,
    version: str | None = None,
    then: dict[str, Any] | None = None,
) -> PackageJob:
    """Queue a quantization build from ``package_id``. ``then``: more params, for what follows
    its success (``serving_default``: ``then``, ``reason`` kept in the version's lineage...).
    Raises ``Invalid`` (unknown type or method), ``NotFound``."""
    from inference.engine.quantize import QUANT_LADDER

    source = package_get(package_id)
    package_check_chat(source, doing="a quantization build (GGUF)")
    quantization = quantization.strip().upper()
    if quantization not in QUANT_LADDER:
        raise Invalid(
            f"quantization: {quantization!r} is not one of {', '.join(QUANT_LADDER)}.",
            field="quantization",
        )
    if method not in ("f16", "requantize"):
        raise Invalid("method: 'f16' (dequantize first) or 'requantize'.", field="method")
    name = name or f"{family_of(source.name)}-{quantization.lower()}"
    check_name(name, version or "1")
    check_version_free(name, version)
    return job_enqueue(
        kind=PackageJob.Kind.BUILD,
        package=source,
        params={"quantization": quantization, "method": method, "name": name, "version": version}
        | (then or {}),
    )


def package_evaluate_enqueue(
    *, package_id: int, subset: int | None = None, then: dict[str, Any] | None = None
) -> PackageJob:
    """Queue an evaluation. Raises ``Conflict`` for an approved or retired version (its
    figures are part of what was approved) or one already being evaluated; ``Invalid`` for an
    embedding package (its evaluation is its registration's: ``inference.semcache.package``)."""
    package = package_get(package_id)
    package_check_chat(package, doing="the chat evaluation suite")
    if package.status in (Status.APPROVED, Status.RETIRED):
        raise Conflict(
            f"{package.key} is {package.status}; its evaluation is final.", code="package_status"
        )
    if PackageJob.objects.filter(
        package=package, kind=PackageJob.Kind.EVALUATE, state__in=["queued", "running"]
    ).exists():
        raise Conflict(f"{package.key} is being evaluated already.", code="job_exists")
    if subset is not None and subset < 1:
        raise Invalid("subset: at least 1 case.", field="subset")
    params = {"subset": subset} | (then or {})
    return job_enqueue(kind=PackageJob.Kind.EVALUATE, package=package, params=params)


def package_import_enqueue(
    *,
    name: str,
    path: str = "",
    requirement: str = "",
    chat_template: str | None = None,
    version: str | None = None,
) -> PackageJob:
    """Queue an import from a file on this host (``path``) or a Python package
    (``requirement``: ``name`` or ``name==version``). Raises ``Invalid``."""
    if bool(path) == bool(requirement):
        raise Invalid("Give either path or requirement.", field="path")
    if path:
        check_import_path(path)
    else:
        _check_requirement(requirement)
    check_name(name, version or "1")
    check_version_free(name, version)
    params = {"name": name, "version": version, "path": path, "requirement": requirement}
    if chat_template:
        check_chat_template(chat_template)
        params["chat_template"] = chat_template
    return job_enqueue(kind=PackageJob.Kind.IMPORT, package=None, params=params)


def _check_requirement(requirement: str) -> None:
    from inference.packages.sources import SourceError, check_requirement

    try:
        check_requirement(requirement)
    except SourceError as exc:
        raise Invalid(f"requirement: {exc}.", field="requirement") from exc


def job_cancel(*, job_id: int) -> PackageJob:
    """Ask for a job to stop: a queued one is cancelled now, a running one by the control loop
    (its process is killed and its scratch space removed). Raises ``NotFound``,
    ``Conflict`` (already finished)."""
    with transaction.atomic():
        job = PackageJob.objects.select_for_update().filter(pk=job_id).first()
        if job is None:
            raise NotFound(f"No job {job_id}.", code="job_not_found")
        if job.finished:
            raise Conflict(f"Job {job_id} has {job.state} already.", code="job_finished")
        job.cancel_requested = True
        if job.state == PackageJob.State.QUEUED:
            job.state = PackageJob.State.CANCELLED
            job.finished_at = timezone.now()
            if job.package_id and "status_before" in job.params:  # queued again after a run
                package_evaluation_ended(
                    package_id=job.package_id,
                    status_before=job.params["status_before"],
                    why="the evaluation was cancelled",
                )
        job.save(update_fields=["cancel_requested", "state", "finished_at"])
        audit_record(action="package.job_cancel", target=f"job {job_id}")
    return job
