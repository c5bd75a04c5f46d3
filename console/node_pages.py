"""The Overview (the array at a glance), the Nodes pages (the inventory, a node, its edit
form, remove, drain, undrain and restart) and Utilization. Thin views: check the role, one
read from ``console.selectors`` (or one change through ``console.services``), then render;
live numbers arrive over ``/ws/live/``."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from console import selectors, services
from console.forms import NodeForm
from console.lib import access
from console.lib.access import role_required
from console.lib.errors import ConsoleError
from console.models import Role
from console.views import _flash_error, _render
from nodes.models import Node
from nodes.selectors import nodes_with_sessions


@role_required(Role.VIEWER)
def overview(request: HttpRequest) -> HttpResponse:
    return _render(request, "console/overview.html", {"page": "overview", **selectors.overview()})


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
            "nodes": nodes_with_sessions(),
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


@role_required(Role.VIEWER)
def utilization(request: HttpRequest) -> HttpResponse:
    return _render(
        request,
        "console/utilization.html",
        {"page": "utilization", "nodes": nodes_with_sessions()},
    )
