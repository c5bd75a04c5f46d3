"""The Cache page (``/cache/``): the semantic cache per namespace (rules, entries, lookups,
hit rate, exact hits, hits the second check refused, false-hit reports, tokens and seconds
saved), the newest false-hit reports, and for operators: a namespace's rules (opting a tool
in) and invalidation. docs/semcache.md."""

from __future__ import annotations

from datetime import UTC, datetime

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from console.forms import CacheInvalidateForm, CacheNamespaceForm
from console.lib.access import role_required
from console.lib.audit import audit_record
from console.models import Role
from console.views import _render
from inference.semcache import service


@role_required(Role.VIEWER)
def cache(request: HttpRequest) -> HttpResponse:
    rows, reports = service.report()
    context = {
        "page": "cache",
        "rows": rows,
        "reports": [{**r.__dict__, "at": datetime.fromtimestamp(r.at, UTC)} for r in reports],
        "form": CacheNamespaceForm(),
        "invalidate_form": CacheInvalidateForm(),
        "defaults": service,
    }
    return _render(request, "console/cache.html", context)


@require_POST
@role_required(Role.OPERATOR)
def cache_namespace(request: HttpRequest) -> HttpResponse:
    form = CacheNamespaceForm(request.POST)
    if not form.is_valid():
        errors = "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items())
        messages.error(request, f"Not saved: {errors}")
        return redirect("console:cache")
    data = dict(form.cleaned_data)
    name = data.pop("name")
    service.namespace_save(name, **data)
    audit_record(
        action="cache.namespace", target=name, changes=[f"{k}={v}" for k, v in data.items()]
    )
    messages.success(request, f"Saved the rules of {name}.")
    return redirect("console:cache")


@require_POST
@role_required(Role.OPERATOR)
def cache_invalidate(request: HttpRequest) -> HttpResponse:
    form = CacheInvalidateForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Not invalidated: the age must be a number of seconds.")
        return redirect("console:cache")
    prefix, older = form.cleaned_data["namespace"], form.cleaned_data["older_than_s"]
    removed = service.invalidate(prefix, older, why="operator")
    audit_record(action="cache.invalidate", target=prefix or "*", changes=[f"removed={removed}"])
    messages.success(request, f"Removed {removed} cached entries of {prefix or 'every namespace'}.")
    return redirect("console:cache")
