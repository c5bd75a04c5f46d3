"""Admin API for model packages (``/api/packages``), django-ninja ``Router``.

Viewers read (versions, lineage, evaluations, jobs); operators queue builds and evaluations and
cancel jobs; admins import (a file on this host, an upload, a Python package), derive a version
with a chat template, approve, reject, retire, set a family's gate and remove unused packages.
Jobs answer 202 with the job; ``GET /api/packages/jobs/{id}`` follows it. The schemas are in
``inference/packages/api_schemas.py``."""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Router

from console import services
from console.lib.access import NEEDS_ADMIN, NEEDS_OPERATOR, NEEDS_VIEWER
from console.lib.errors import NotFound
from inference.models import ModelPackage, PackageJob, PackagePolicy
from inference.packages import services as package_services
from inference.packages.api_schemas import (
    ApproveIn,
    EvaluateIn,
    GatePolicyIn,
    GatePolicyOut,
    ImportIn,
    JobOut,
    PackageDetailOut,
    PackageIn,
    PackageOut,
    QuantizeIn,
    RejectIn,
    TemplateIn,
    UploadIn,
    UploadOut,
)
from inference.packages.gate_policy import policy_update
from inference.packages.selectors import package_facts
from nodes.selectors import takes_sessions

router = Router()


def _package_out(package: ModelPackage) -> dict:
    return {
        "id": package.pk,
        "kind": package.kind,
        "key": package.key,
        "name": package.name,
        "version": package.version,
        "gguf_path": package.gguf_path,
        "sha256": package.sha256,
        "quantization": package.quantization,
        "architecture": package.architecture,
        "context_window": package.context_window,
        "created_at": package.created_at,
        "nodes": package.nodes.count(),
        "up": sum(takes_sessions(n) for n in package.nodes.all()),
        "family": package.family,
        "status": package.status,
        "status_reason": package.status_reason,
        "size_bytes": package.size_bytes,
        "parameters": package.parameters,
        "template_source": package.template_source,
        "chat_template_sha256": package.chat_template_sha256,
        "parent_id": package.parent_id,
        "lineage": package.lineage or {},
        "tool_accuracy": (((package.evaluation or {}).get("modes") or {}).get("grammar") or {}).get(
            "tool_accuracy"
        ),
        "gate": (package.gate or {}).get("summary"),
    }


def _job_out(job: PackageJob) -> dict:
    return {
        "id": job.pk,
        "kind": job.kind,
        "state": job.state,
        "package_id": job.package_id,
        "output_id": job.output_id,
        "output_key": job.output.key if job.output_id else None,
        "params": job.params,
        "progress": job.progress,
        "cancel_requested": job.cancel_requested,
        "message": job.message,
        "error": job.error,
        "result": job.result,
        "log": job.log[-8000:],
        "created_by": job.created_by,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
    }


@router.get(
    "/packages",
    response=list[PackageOut],
    tags=["packages"],
    summary="List packages",
    auth=NEEDS_VIEWER,
)
def packages_list(request: HttpRequest) -> list[dict]:
    return [_package_out(p) for p in ModelPackage.objects.all()]


@router.get(
    "/packages/{int:package_id}",
    response=PackageDetailOut,
    tags=["packages"],
    summary="Show a package and what its GGUF file says",
    auth=NEEDS_VIEWER,
)
def packages_show(request: HttpRequest, package_id: int) -> dict:
    package = package_services.package_get(package_id)
    facts = package_facts(package)
    return {
        **_package_out(package),
        "chat_template": package.chat_template,
        "gguf": {**facts.__dict__},
        "tensor_types": package.tensor_types or {},
        "ctx_per_seq": package.ctx_per_seq,
        "sequences": package.sequences,
        "sampling": package.sampling or {},
        "build_report": package.build_report,
        "evaluation": package.evaluation,
        "gate_result": package.gate,
    }


@router.post(
    "/packages/import",
    response={202: JobOut},
    tags=["packages"],
    summary="Import a GGUF file on this host or from a Python package (a job)",
    auth=NEEDS_ADMIN,
)
def packages_import(request: HttpRequest, payload: ImportIn) -> tuple[int, dict]:
    job = package_services.package_import_enqueue(**payload.dict())
    return 202, _job_out(job)


def _upload_out(upload) -> dict:
    from inference.packages.uploads import part_bytes

    return {
        "id": upload.id,
        "name": upload.name,
        "version": upload.version,
        "size": upload.size,
        "received": upload.received,
        "part_bytes": part_bytes(),
    }


@router.post(
    "/packages/uploads",
    response={201: UploadOut},
    tags=["packages"],
    summary="Start an upload of a GGUF file in parts",
    description="Announce the file (name, version, size, sha256); then PUT its parts in "
    "order to /packages/uploads/{id}?offset=N (the raw bytes, at most part_bytes each) and "
    "POST /packages/uploads/{id}/finish. Over PHALANX_PACKAGE_UPLOAD_MAX_BYTES: 422; "
    "name:version taken: 409; not enough disk: 507.",
    auth=NEEDS_ADMIN,
)
def uploads_begin(request: HttpRequest, payload: UploadIn) -> tuple[int, dict]:
    from inference.packages import uploads

    return 201, _upload_out(uploads.upload_begin(**payload.dict()))


@router.get(
    "/packages/uploads/{upload_id}",
    response=UploadOut,
    tags=["packages"],
    summary="How much of an upload arrived (resume from received)",
    auth=NEEDS_ADMIN,
)
def uploads_show(request: HttpRequest, upload_id: str) -> dict:
    from inference.packages import uploads

    return _upload_out(uploads.upload_get(upload_id=upload_id))


@router.put(
    "/packages/uploads/{upload_id}",
    response=UploadOut,
    tags=["packages"],
    summary="Send one part of an upload (the raw request body)",
    description="offset must be the upload's received count (409 naming it otherwise). The "
    "first part must start with GGUF (400 otherwise, and the upload is dropped).",
    auth=NEEDS_ADMIN,
)
def uploads_part(request: HttpRequest, upload_id: str, offset: int) -> dict:
    from inference.packages import uploads

    upload = uploads.upload_append(upload_id=upload_id, offset=offset, data=request.body)
    return _upload_out(upload)


@router.post(
    "/packages/uploads/{upload_id}/finish",
    response={200: PackageOut, 201: PackageOut},
    tags=["packages"],
    summary="Check a complete upload's sha256 and import it as a draft version",
    description="201 with the new version (200: the same file under the same name:version "
    "again). Bytes missing: 409. sha256 mismatch or not a readable GGUF: 400, nothing kept.",
    auth=NEEDS_ADMIN,
)
def uploads_finish(request: HttpRequest, upload_id: str) -> tuple[int, dict]:
    from inference.packages import uploads

    imported = uploads.upload_finish(upload_id=upload_id)
    out = _package_out(imported.package)
    out["warnings"] = imported.warnings
    return (201 if imported.created else 200), out


@router.delete(
    "/packages/uploads/{upload_id}",
    response={204: None},
    tags=["packages"],
    summary="Drop an upload and what arrived of it",
    auth=NEEDS_ADMIN,
)
def uploads_discard(request: HttpRequest, upload_id: str) -> tuple[int, None]:
    from inference.packages import uploads

    uploads.upload_discard(upload_id=upload_id)
    return 204, None


@router.post(
    "/packages/{int:package_id}/quantize",
    response={202: JobOut},
    tags=["packages"],
    summary="Build a quantized version with llama.cpp's quantizer (a job)",
    auth=NEEDS_OPERATOR,
)
def packages_quantize(
    request: HttpRequest, package_id: int, payload: QuantizeIn
) -> tuple[int, dict]:
    job = package_services.package_build_enqueue(package_id=package_id, **payload.dict())
    return 202, _job_out(job)


@router.post(
    "/packages/{int:package_id}/evaluate",
    response={202: JobOut},
    tags=["packages"],
    summary="Run the smoke test, the tool-call suite and perplexity, then the gate (a job)",
    auth=NEEDS_OPERATOR,
)
def packages_evaluate(
    request: HttpRequest, package_id: int, payload: EvaluateIn
) -> tuple[int, dict]:
    job = package_services.package_evaluate_enqueue(package_id=package_id, subset=payload.subset)
    return 202, _job_out(job)


@router.post(
    "/packages/{int:package_id}/approve",
    response=PackageOut,
    tags=["packages"],
    summary="Approve a version (one that has not passed its gate only with an override reason)",
    auth=NEEDS_ADMIN,
)
def packages_approve(request: HttpRequest, package_id: int, payload: ApproveIn) -> dict:
    return _package_out(
        package_services.package_approve(
            package_id=package_id, override_reason=payload.override_reason
        )
    )


@router.post(
    "/packages/{int:package_id}/reject",
    response=PackageOut,
    tags=["packages"],
    summary="Reject a version, saying why",
    auth=NEEDS_ADMIN,
)
def packages_reject(request: HttpRequest, package_id: int, payload: RejectIn) -> dict:
    return _package_out(
        package_services.package_reject(package_id=package_id, reason=payload.reason)
    )


@router.post(
    "/packages/{int:package_id}/retire",
    response=PackageOut,
    tags=["packages"],
    summary="Retire a version no node serves (it can no longer be deployed)",
    auth=NEEDS_ADMIN,
)
def packages_retire(request: HttpRequest, package_id: int) -> dict:
    return _package_out(package_services.package_retire(package_id=package_id))


@router.post(
    "/packages/{int:package_id}/template",
    response={201: PackageOut},
    tags=["packages"],
    summary="A new version whose GGUF carries this chat template",
    auth=NEEDS_ADMIN,
)
def packages_template(
    request: HttpRequest, package_id: int, payload: TemplateIn
) -> tuple[int, dict]:
    package = package_services.package_with_template(
        package_id=package_id, chat_template=payload.chat_template, version=payload.version
    )
    return 201, _package_out(package)


@router.get(
    "/packages/jobs",
    response=list[JobOut],
    tags=["packages"],
    summary="Package jobs, newest first",
    auth=NEEDS_VIEWER,
)
def jobs_list(request: HttpRequest, limit: int = 50) -> list[dict]:
    return [_job_out(j) for j in PackageJob.objects.all()[: max(1, min(limit, 500))]]


@router.get(
    "/packages/jobs/{int:job_id}",
    response=JobOut,
    tags=["packages"],
    summary="A package job: state, progress (0..1), message, log, result",
    auth=NEEDS_VIEWER,
)
def jobs_show(request: HttpRequest, job_id: int) -> dict:
    job = PackageJob.objects.filter(pk=job_id).first()
    if job is None:
        raise NotFound(f"No job {job_id}.", code="job_not_found")
    return _job_out(job)


@router.post(
    "/packages/jobs/{int:job_id}/cancel",
    response=JobOut,
    tags=["packages"],
    summary="Cancel a package job (nothing it made is kept)",
    auth=NEEDS_OPERATOR,
)
def jobs_cancel(request: HttpRequest, job_id: int) -> dict:
    return _job_out(package_services.job_cancel(job_id=job_id))


def _policy_out(family: str) -> dict:
    row = PackagePolicy.objects.filter(family=family).first() or PackagePolicy(family=family)
    return {
        "family": family,
        "min_tool_accuracy": row.min_tool_accuracy,
        "min_schema_valid": row.min_schema_valid,
        "max_regression": row.max_regression,
        "max_perplexity_increase": row.max_perplexity_increase,
    }


@router.get(
    "/packages/policies/{family}",
    response=GatePolicyOut,
    tags=["packages"],
    summary="The gate of a model family (defaults until set)",
    auth=NEEDS_VIEWER,
)
def policies_show(request: HttpRequest, family: str) -> dict:
    return _policy_out(family)


@router.put(
    "/packages/policies/{family}",
    response=GatePolicyOut,
    tags=["packages"],
    summary="Set a model family's gate",
    auth=NEEDS_ADMIN,
)
def policies_update(request: HttpRequest, family: str, payload: GatePolicyIn) -> dict:
    changes = {k: v for k, v in payload.dict().items() if v is not None}
    policy_update(family=family, changes=changes)
    return _policy_out(family)


@router.post(
    "/packages",
    response={200: PackageOut, 201: PackageOut},
    tags=["packages"],
    summary="Register a GGUF file as a package version (idempotent)",
    auth=NEEDS_ADMIN,
)
def packages_create(request: HttpRequest, payload: PackageIn) -> tuple[int, dict]:
    package, created = services.package_register_file(
        name=payload.name, version=payload.version, gguf_path=payload.gguf_path
    )
    return (201 if created else 200), _package_out(package)


@router.delete(
    "/packages/{int:package_id}",
    response={204: None},
    tags=["packages"],
    summary="Remove a version no node serves (not an approved one, not one with a job)",
    auth=NEEDS_ADMIN,
)
def packages_delete(request: HttpRequest, package_id: int) -> tuple[int, None]:
    package_services.package_delete(package_id=package_id)
    return 204, None
