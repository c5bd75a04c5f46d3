"""The Routing pages: the policy editor and the live routing table (``/routing/``), a
session's route and decision log, and releasing a session (``/sessions/<id>/``)."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from console import selectors
from console.forms import PolicyForm
from console.lib import access
from console.lib.access import role_required
from console.models import Role
from console.views import _render
from inference import services as inference_services
from inference.models import RoutingPolicy, SessionRoute
from inference.selectors import session_routes

ROUTES_SHOWN = 200  # the newest session routes the routing table shows


@role_required(Role.VIEWER)
def routing(request: HttpRequest) -> HttpResponse:
    """The policy editor (operator) and the live routing table."""
    form = PolicyForm(request.POST or None, instance=RoutingPolicy.load())
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
            "routes": session_routes(limit=ROUTES_SHOWN)[1],
        },
        status=400 if form.errors else 200,
    )


@role_required(Role.VIEWER)
def routing_table(request: HttpRequest) -> HttpResponse:
    """The routing table's rows alone (the routing page refreshes them every 2 s)."""
    return render(
        request, "console/_routes.html", {"routes": session_routes(limit=ROUTES_SHOWN)[1]}
    )


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
