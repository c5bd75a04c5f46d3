"""The Packages pages: versions per family and recent jobs, with the register, import and
upload forms (``/packages/``); a version, with what its file says, its evaluation and gate,
its family and its chat template (``/packages/<id>/``), and the changes made on it
(``PACKAGE_ACTIONS``: evaluate, quantize, approve, reject, retire, a new chat template)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple

from django import forms
from django.contrib import messages
from django.core.exceptions import BadRequest
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from console import selectors, services
from console.forms import (
    ApproveForm,
    EvaluateForm,
    ImportPathForm,
    ImportPythonForm,
    PackageForm,
    QuantizeForm,
    RejectForm,
    RetireForm,
    TemplateForm,
    UploadForm,
)
from console.lib import access
from console.lib.access import role_required
from console.lib.errors import ConsoleError
from console.models import Role
from console.views import _form_error, _render
from inference.models import ModelPackage, PackageJob
from inference.packages import services as package_services


def _package_colours() -> dict[str, Any]:
    return {
        "status_colours": dict(ModelPackage.STATUS_COLOURS),
        "job_colours": dict(PackageJob.STATE_COLOURS),
    }


# the packages page's forms: the POST field "form" names the one sent (none: the register form)
PACKAGES_FORMS: dict[str, tuple[type[forms.Form], str | None]] = {
    "register": (PackageForm, None),
    "path": (ImportPathForm, "path"),
    "python": (ImportPythonForm, "python"),
}


@role_required(Role.VIEWER)
def packages(request: HttpRequest) -> HttpResponse:
    """Versions per family and recent jobs; admins register, import (a job) and upload."""
    sent = request.POST.get("form", "register") if request.method == "POST" else None
    if sent is not None and sent not in PACKAGES_FORMS:
        raise BadRequest(f"no form {sent!r}")
    bound = {
        name: form_class(request.POST if name == sent else None, prefix=prefix)
        for name, (form_class, prefix) in PACKAGES_FORMS.items()
    }
    status = 200
    if sent is not None:
        access.require(request.principal, Role.ADMIN)  # type: ignore[attr-defined]
        form = bound[sent]
        status = 400
        if form.is_valid():
            try:
                return _packages_post(request, sent, form)
            except ConsoleError as exc:
                _form_error(request, form, exc)
                status = exc.status
    return _render(
        request,
        "console/packages.html",
        {
            "page": "packages",
            **selectors.packages_page(),
            "forms": bound,
            "form": bound["register"],
            "upload_form": UploadForm(prefix="upload"),
            **_package_colours(),
        },
        status=status,
    )


def _packages_post(request: HttpRequest, sent: str, form: forms.Form) -> HttpResponse:
    if sent == "register":
        package, created = services.package_register_file(**form.cleaned_data)
        messages.success(request, f"{'Registered' if created else 'Already had'} {package.key}.")
        return redirect("console:package", package_id=package.pk)
    job = package_services.package_import_enqueue(**form.changes())  # type: ignore[attr-defined]
    messages.success(request, f"Import job {job.pk} queued: {job.params['name']}.")
    return redirect(f"{reverse('console:packages')}#job-{job.pk}")


@role_required(Role.VIEWER)
def package(request: HttpRequest, package_id: int) -> HttpResponse:
    """A version: what it is, where it came from, its evaluation and gate, its family side by
    side, its chat template against another version's (``?diff=<id>``), jobs and history."""
    return _package_page(request, package_id)


def _package_page(
    request: HttpRequest,
    package_id: int,
    bound: dict[str, forms.Form] | None = None,
    status: int = 200,
) -> HttpResponse:
    diff = request.GET.get("diff", "")
    detail = selectors.package_detail(
        package_id, diff_id=int(diff) if re.fullmatch(r"[0-9]{1,18}", diff) else None
    )
    if detail is None:
        raise Http404(f"No package {package_id}")
    action_forms = {
        name: (bound or {}).get(name) or action.form(prefix=name)
        for name, action in PACKAGE_ACTIONS.items()
    }
    if not (detail["package"].gate or {}).get("passed"):  # the browser asks for the reason
        action_forms["approve"].fields["override_reason"].widget.attrs["required"] = True
    context = {"page": "packages", **detail, "forms": action_forms, **_package_colours()}
    return _render(request, "console/package.html", context, status=status)


class _Action(NamedTuple):
    """A change on the version page: the role it needs, its form, and the service call
    (package id, cleaned data) -> (success message, where to go next)."""

    role: Role
    form: type[forms.Form]
    run: Callable[[int, dict[str, Any]], tuple[str, str]]


def _page_of(package_id: int, anchor: str = "") -> str:
    url = reverse("console:package", args=[package_id])
    return f"{url}#{anchor}" if anchor else url


def _evaluate(package_id: int, data: dict[str, Any]) -> tuple[str, str]:
    job = package_services.package_evaluate_enqueue(package_id=package_id, subset=data["subset"])
    return f"Evaluation queued (job {job.pk}).", _page_of(package_id, "jobs")


def _quantize(package_id: int, data: dict[str, Any]) -> tuple[str, str]:
    job = package_services.package_build_enqueue(
        package_id=package_id,
        quantization=data["quantization"],
        method=data["method"],
        name=data["name"] or None,
        version=data["version"] or None,
    )
    return f"{job.params['quantization']} build queued (job {job.pk}).", _page_of(
        package_id, "jobs"
    )


def _approve(package_id: int, data: dict[str, Any]) -> tuple[str, str]:
    package = package_services.package_approve(
        package_id=package_id, override_reason=data["override_reason"]
    )
    return f"Approved {package.key} ({package.status_reason}).", _page_of(package_id)


def _reject(package_id: int, data: dict[str, Any]) -> tuple[str, str]:
    package = package_services.package_reject(package_id=package_id, reason=data["reason"])
    return f"Rejected {package.key}.", _page_of(package_id)


def _retire(package_id: int, data: dict[str, Any]) -> tuple[str, str]:
    package = package_services.package_retire(package_id=package_id)
    return f"Retired {package.key}; no node can be given it again.", _page_of(package_id)


def _template(package_id: int, data: dict[str, Any]) -> tuple[str, str]:
    package = package_services.package_with_template(
        package_id=package_id, chat_template=data["chat_template"], version=data["version"] or None
    )
    return f"Made {package.key} with the chat template.", _page_of(package.pk)


PACKAGE_ACTIONS: dict[str, _Action] = {
    "evaluate": _Action(Role.OPERATOR, EvaluateForm, _evaluate),
    "quantize": _Action(Role.OPERATOR, QuantizeForm, _quantize),
    "approve": _Action(Role.ADMIN, ApproveForm, _approve),
    "reject": _Action(Role.ADMIN, RejectForm, _reject),
    "retire": _Action(Role.ADMIN, RetireForm, _retire),
    "template": _Action(Role.ADMIN, TemplateForm, _template),
}


@require_POST
@role_required(Role.VIEWER)
def package_action(request: HttpRequest, package_id: int, action: str) -> HttpResponse:
    """``POST /packages/<id>/<action>/`` (``PACKAGE_ACTIONS``): on success a message and a
    redirect; on a refusal the version page again with the message, status 4xx."""
    chosen = PACKAGE_ACTIONS.get(action)
    if chosen is None:
        raise Http404(f"No action {action}")
    access.require(request.principal, chosen.role)  # type: ignore[attr-defined]
    form = chosen.form(request.POST, prefix=action)
    status = 400
    if form.is_valid():
        try:
            text, target = chosen.run(package_id, form.cleaned_data)
        except ConsoleError as exc:
            _form_error(request, form, exc)
            status = exc.status
        else:
            messages.success(request, text)
            return redirect(target)
    return _package_page(request, package_id, {action: form}, status)
