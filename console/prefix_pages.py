"""The Prefixes page (``/prefixes/``): shared prefixes registered by operators, which nodes
hold each and which are still to get it; operators register and remove them.
docs/engine.md, "Registered prefixes"."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from console.forms import SharedPrefixForm
from console.lib.access import role_required
from console.lib.errors import ConsoleError
from console.models import Role
from console.views import _render
from inference.prefixes import services


@role_required(Role.VIEWER)
def prefixes(request: HttpRequest, form: SharedPrefixForm | None = None) -> HttpResponse:
    context = {
        "page": "prefixes",
        "views": services.prefixes_overview(),
        "form": form or SharedPrefixForm(),
        "limit": services.MAX_REGISTERED,
    }
    return _render(request, "console/prefixes.html", context, status=400 if form else 200)


@require_POST
@role_required(Role.OPERATOR)
def prefix_register(request: HttpRequest) -> HttpResponse:
    form = SharedPrefixForm(request.POST)
    if not form.is_valid():
        return prefixes(request, form)
    data = form.cleaned_data
    try:
        services.prefix_register(
            name=data["name"],
            model=data["model"],
            system=data["system"],
            tools=data["tools"],
            created_by_id=request.user.pk,
        )
    except ConsoleError as exc:
        form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        return prefixes(request, form)
    messages.success(request, f"Registered {data['name']}: nodes serving its model get it next.")
    return redirect("console:prefixes")


@require_POST
@role_required(Role.OPERATOR)
def prefix_remove(request: HttpRequest, name: str) -> HttpResponse:
    try:
        services.prefix_remove(name=name)
    except ConsoleError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Removed {name}; nodes keep it until it is displaced.")
    return redirect("console:prefixes")
