"""The Config page (the array as a config file; admins apply one, or a dry run of it), its
download (``/config/phalanx.yaml``), and the Audit page (every change: who, when, what)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from console import selectors
from console.config_file import ConfigError, apply_config_text, export_config
from console.forms import ConfigForm
from console.lib import access
from console.lib.access import role_required
from console.lib.errors import ConsoleError
from console.models import Role
from console.views import _render


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
