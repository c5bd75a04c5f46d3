"""The operator pages. Thin views: check the role, one read from ``console.selectors`` (or one
change through ``console.services``), then render. Live numbers arrive over ``/ws/live/``."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.staticfiles import finders
from django.core.exceptions import BadRequest
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST
from django.views.static import serve

from console import selectors, services
from console.config_file import ConfigError, apply_config_text, export_config
from console.forms import (
    ApproveForm,
    ConfigForm,
    EvaluateForm,
    ImportPathForm,
    ImportPythonForm,
    NodeForm,
    PackageForm,
    PolicyForm,
    QuantizeForm,
    RejectForm,
    RetireForm,
    TemplateForm,
    TokenForm,
    UploadForm,
)
from console.lib import access
from console.lib.access import role_required
from console.lib.errors import ConsoleError
from console.lib.metrics import prometheus_text
from console.models import Role
from inference import services as inference_services
from inference import tokens as token_services
from inference.models import ModelPackage, PackageJob, SessionRoute
from inference.packages import services as package_services
from nodes.models import Node

NAV = [
    ("overview", "Overview"),
    ("nodes", "Nodes"),
    ("packages", "Packages"),
    ("upgrades", "Upgrades"),
    ("validation", "Validation"),
    ("loadtests", "Load tests"),
    ("routing", "Routing"),
    ("utilization", "Utilization"),
    ("playground", "Playground"),
    ("tokens", "Tokens"),
    ("config", "Config"),
    ("audit", "Audit"),
]


def _render(
    request: HttpRequest, template: str, context: dict[str, Any], status: int = 200
) -> HttpResponse:
    principal = access.page_principal(request)
    return render(
        request,
        template,
        {
            **context,
            "principal": principal,
            "can_operate": principal.can(Role.OPERATOR),
            "can_admin": principal.can(Role.ADMIN),
            "nav": [
                (name, label)
                for name, label in NAV
                if name != "tokens" or principal.can(Role.ADMIN)
            ],
            "state_colours": {k: v for k, v in Node.STATE_COLOURS.items()},
        },
        status=status,
    )


def _flash_error(request: HttpRequest, exc: ConsoleError) -> None:
    messages.error(request, exc.message)


# --- health, metrics, static ---------------------------------------------------------------


@require_GET
def health(request: HttpRequest) -> JsonResponse:
    """``GET /health``: 200 ``{"status": "ok"}`` while the control plane answers (no auth).
    ``?challenge=<32-64 hex digits>`` adds ``identity`` (``{"pid", "proof"}``): the proof that
    this is the array's control plane, bound to the address the request arrived on, that a
    load-test worker checks before it sends a token it minted
    (``inference.loadtests.identity``)."""
    body: dict[str, Any] = {"status": "ok"}
    if "challenge" in request.GET:
        from inference.loadtests.identity import answer

        port = request.META.get("SERVER_PORT", "0")
        identity = answer(
            request.GET["challenge"],
            host=request.META.get("SERVER_NAME", ""),
            port=int(port) if str(port).isdigit() else 0,
        )
        if identity is not None:
            body["identity"] = identity
    return JsonResponse(body)


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """``GET /metrics``: Prometheus text; Bearer token or a logged-in user with a role."""
    principal = access.principal_for_user(request.user) or access.principal_for_token(
        _bearer(request)
    )
    if principal is None or principal.role is None:
        response = HttpResponse("authentication required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = "Bearer"
        return response
    return HttpResponse(prometheus_text(), content_type="text/plain; version=0.0.4; charset=utf-8")


def _bearer(request: HttpRequest) -> str | None:
    from inference.tokens import bearer_token

    return bearer_token(request.headers.get("Authorization"))


def static(request: HttpRequest, path: str) -> HttpResponse:
    """Serve static files (the embedded control plane has no web server in front): the
    project's ``static/`` and the apps' own (the admin's, django-ninja's Swagger UI), found the
    way ``collectstatic`` finds them, so nothing is loaded from the internet."""
    found = finders.find(path)
    if not found:
        raise Http404(f"no static file {path}")
    found_path = Path(found)
    response = serve(request, found_path.name, document_root=found_path.parent)
    response["Cache-Control"] = "public, max-age=3600"
    return response


# --- overview -----------------------------------------------------------------------------


@role_required(Role.VIEWER)
def overview(request: HttpRequest) -> HttpResponse:
    return _render(request, "console/overview.html", {"page": "overview", **selectors.overview()})


# --- nodes --------------------------------------------------------------------------------


@role_required(Role.VIEWER)
def nodes(request: HttpRequest) -> HttpResponse:
    """The inventory; admins add nodes here (POST)."""
    form = NodeForm(request.POST or None, prefix="add")
    if request.method == "POST":
        access.require(request.principal, Role.ADMIN)  # type: ignore[attr-defined]
        if form.is_valid():
            try:
                node = services.node_create(**form.changes())
            except ConsoleError as exc:
                form.add_error(exc.field if exc.field in form.fields else None, exc.message)
            else:
                messages.success(
                    request, f"Registered {node.node_id}; waiting for its first probe."
                )
                return redirect("console:node", node_id=node.node_id)
    return _render(
        request,
        "console/nodes.html",
        {
            "page": "nodes",
            "nodes": selectors.nodes_with_sessions(),
            "form": form,
        },
        status=400 if form.errors else 200,
    )


@role_required(Role.VIEWER)
def node(request: HttpRequest, node_id: str) -> HttpResponse:
    detail = selectors.node_detail(node_id, page=request.GET.get("page"))
    if detail is None:
        raise Http404(f"No node {node_id}")
    return _render(request, "console/node.html", {"page": "nodes", **detail})


@role_required(Role.ADMIN)
def node_edit(request: HttpRequest, node_id: str) -> HttpResponse:
    instance = Node.objects.filter(node_id=node_id).first()
    if instance is None:
        raise Http404(f"No node {node_id}")
    form = NodeForm(request.POST or None, instance=instance)
    if request.method == "POST" and form.is_valid():
        changes = form.changes()
        changes.pop("node_id", None)
        try:
            services.node_update(node_id=node_id, changes=changes)
        except ConsoleError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        else:
            messages.success(request, f"Saved {node_id}.")
            return redirect("console:node", node_id=node_id)
    return _render(
        request, "console/node_edit.html", {"page": "nodes", "form": form, "node": instance}
    )


@require_POST
@role_required(Role.ADMIN)
def node_remove(request: HttpRequest, node_id: str) -> HttpResponse:
    try:
        services.node_remove(node_id=node_id)
    except ConsoleError as exc:
        _flash_error(request, exc)
    else:
        messages.success(request, f"Removed {node_id}.")
    return redirect("console:nodes")


def _drain_view(drained: bool):
    @require_POST
    @role_required(Role.OPERATOR)
    def view(request: HttpRequest, node_id: str) -> HttpResponse:
        try:
            event = services.node_set_drained(node_id=node_id, drained=drained)
        except ConsoleError as exc:
            _flash_error(request, exc)
        else:
            verb = "Drained" if drained else "Undrained"
            messages.success(request, f"{verb} {node_id}." if event else f"{node_id}: no change.")
        target = request.POST.get("next", "")
        if target and url_has_allowed_host_and_scheme(target, allowed_hosts=None):
            return redirect(target)
        return redirect("console:node", node_id=node_id)

    return view


node_drain = _drain_view(True)
node_undrain = _drain_view(False)


@require_POST
@role_required(Role.OPERATOR)
def node_restart(request: HttpRequest, node_id: str) -> HttpResponse:
    """Drain the node, then have the embedded array restart its agent (``up`` does it once no
    stream is in flight)."""
    try:
        services.node_restart(node_id=node_id)
    except ConsoleError as exc:
        _flash_error(request, exc)
    else:
        messages.success(
            request,
            f"Restarting {node_id}: drained now; its agent restarts once no stream is in flight.",
        )
    return redirect("console:node", node_id=node_id)


# --- packages -----------------------------------------------------------------------------


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


def _form_error(request: HttpRequest, form: forms.Form, exc: ConsoleError) -> None:
    """The service's refusal, at the top of the page and at its field when the form has it."""
    messages.error(request, exc.message)
    if exc.field in form.fields:
        form.add_error(exc.field, exc.message)


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


# --- routing ------------------------------------------------------------------------------


@role_required(Role.VIEWER)
def routing(request: HttpRequest) -> HttpResponse:
    """The policy editor (operator) and the live routing table."""
    form = PolicyForm(request.POST or None, instance=selectors.policy())
    if request.method == "POST":
        access.require(request.principal, Role.OPERATOR)  # type: ignore[attr-defined]
        if form.is_valid():
            inference_services.policy_update(changes=form.cleaned_data)
            messages.success(request, "Policy saved; it applies to the next request and tick.")
            return redirect("console:routing")
    return _render(
        request,
        "console/routing.html",
        {
            "page": "routing",
            "form": form,
            "routes": selectors.routing_table(),
        },
        status=400 if form.errors else 200,
    )


@role_required(Role.VIEWER)
def routing_table(request: HttpRequest) -> HttpResponse:
    """The routing table's rows alone (the routing page refreshes them every 2 s)."""
    return render(request, "console/_routes.html", {"routes": selectors.routing_table()})


@role_required(Role.VIEWER)
def session(request: HttpRequest, session_id: str) -> HttpResponse:
    detail = selectors.session_detail(session_id)
    if detail is None:
        raise Http404("No such session")
    return _render(request, "console/session.html", {"page": "routing", **detail})


@require_POST
@role_required(Role.OPERATOR)
def session_release(request: HttpRequest, session_id: str) -> HttpResponse:
    """Unpin a session (its next turn is placed afresh) and erase its KV on the node it left."""
    try:
        released, _ = inference_services.route_release_erasing(session_id=session_id)
    except SessionRoute.DoesNotExist as exc:
        raise Http404("No such session") from exc
    messages.success(request, f"Released {session_id}." if released else "It was not pinned.")
    return redirect("console:session", session_id=session_id)


# --- utilization, playground --------------------------------------------------------------


@role_required(Role.VIEWER)
def utilization(request: HttpRequest) -> HttpResponse:
    return _render(
        request,
        "console/utilization.html",
        {"page": "utilization", "nodes": selectors.nodes_with_sessions()},
    )


@role_required(Role.VIEWER)
def playground(request: HttpRequest) -> HttpResponse:
    return _render(
        request,
        "console/playground.html",
        {
            "page": "playground",
            "models": selectors.served_models(),
            "session_id": f"playground-{uuid.uuid4().hex[:12]}",
        },
    )


# --- tokens, config -----------------------------------------------------------------------


@role_required(Role.ADMIN)
def tokens(request: HttpRequest) -> HttpResponse:
    """Tokens; a new token's plaintext is shown in this one answer only."""
    form = TokenForm(request.POST or None)
    plaintext = None
    if request.method == "POST" and form.is_valid():
        try:
            _, plaintext = token_services.token_issue(
                name=form.cleaned_data["name"],
                role=Role(form.cleaned_data["role"]),
                created_by_id=request.user.pk,
            )
        except ConsoleError as exc:
            form.add_error("name", exc.message)
        else:
            form = TokenForm()
    return _render(
        request,
        "console/tokens.html",
        {
            "page": "tokens",
            "tokens": selectors.tokens(),
            "form": form,
            "plaintext": plaintext,
        },
    )


@require_POST
@role_required(Role.ADMIN)
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    try:
        token = token_services.token_withdraw(token_id=token_id)
    except ConsoleError as exc:
        _flash_error(request, exc)
    else:
        messages.success(request, f"Revoked {token.name} ({token.prefix}…).")
    return redirect("console:tokens")


@role_required(Role.VIEWER)
def config(request: HttpRequest) -> HttpResponse:
    """The array as a config file; admins apply one (upload or paste)."""
    form = ConfigForm(request.POST or None, request.FILES or None)
    report, error = None, None
    if request.method == "POST":
        access.require(request.principal, Role.ADMIN)  # type: ignore[attr-defined]
        if form.is_valid():
            try:
                report = apply_config_text(
                    form.cleaned_data["text"],
                    prune=form.cleaned_data["prune"],
                    dry_run=form.cleaned_data["dry_run"],
                )
            except (ConfigError, ConsoleError) as exc:
                error = exc
            else:
                # the next Apply must not silently be another dry run: keep the text, untick it
                form = ConfigForm(initial={"text": form.cleaned_data["text"], "dry_run": False})
    return _render(
        request,
        "console/config.html",
        {
            "page": "config",
            "form": form,
            "report": report,
            "error": error,
            "current": export_config(),
        },
        status=422 if error else 200,
    )


@role_required(Role.VIEWER)
def audit(request: HttpRequest) -> HttpResponse:
    """Every change: who, when, what, before and after (newest first)."""
    return _render(
        request, "console/audit.html", {"page": "audit", "entries": selectors.audit_entries()}
    )


@role_required(Role.VIEWER)
def config_download(request: HttpRequest) -> HttpResponse:
    response = HttpResponse(export_config(), content_type="application/yaml; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="phalanx.yaml"'
    return response


@login_required
def no_role(request: HttpRequest) -> HttpResponse:
    return render(request, "console/no_role.html", status=403)
