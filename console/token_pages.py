"""The Tokens page (admins): the API tokens with their limits in force, issuing one (its
plaintext shown in that one answer only), revoking one, and the quota forms: a token's quota
and each role's default (``inference.usage.quotas`` checks and stores them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from console.forms import QuotaForm, TokenForm
from console.lib.access import role_required
from console.lib.errors import ConsoleError
from console.models import Role
from console.views import _flash_error, _form_error, _render
from inference import tokens as token_services
from inference.models import ApiToken
from inference.usage.quotas import (
    DEFAULT_PRIORITY,
    Limits,
    limits_for,
    merged,
    quota_set,
    quota_table,
    quota_values,
)


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
    table = quota_table()
    in_force = {row["token_id"]: quota_summary(row["in_force"]) for row in table["tokens"]}
    rows = [{"token": t, "quota": in_force.get(t.pk, "")} for t in token_services.tokens_all()]
    defaults = [(r, quota_summary(merged(None, table["roles"][r]))) for r in Role.values]
    return _render(
        request,
        "console/tokens.html",
        {
            "page": "tokens",
            "rows": rows,
            "role_defaults": defaults,
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


@role_required(Role.ADMIN)
def token_quota(request: HttpRequest, token_id: int) -> HttpResponse:
    """A token's quota: a blank limit takes its role's default (shown as the placeholder)."""
    token = ApiToken.objects.filter(pk=token_id).first()
    if token is None:
        raise Http404(f"No token {token_id}.")
    role = token_services.token_role(token).value
    inherited = {
        name: f"{role} default, {_shown(name, value)}"
        for name, value in quota_values(role=role).items()
    }
    return _quota_page(
        request,
        subject=f"token {token.name}",
        target={"token_id": token.pk},
        inherited=inherited,
        in_force=lambda: limits_for(role=role, token_id=token.pk),
    )


@role_required(Role.ADMIN)
def role_quota(request: HttpRequest, role: str) -> HttpResponse:
    """A role's default quota, for its tokens' blank limits: a blank default is no limit."""
    if role not in Role.values:
        raise Http404(f"No role {role}.")
    return _quota_page(
        request,
        subject=f"the {role} role's default",
        target={"role": role},
        inherited={},
        in_force=lambda: limits_for(role=role),
    )


def _quota_page(
    request: HttpRequest,
    *,
    subject: str,
    target: dict[str, Any],
    inherited: dict[str, str],
    in_force: Callable[[], Limits],
) -> HttpResponse:
    """The quota form of ``target`` (``quota_set``'s ``token_id=`` or ``role=``); saved, back to
    the Tokens page with what is in force now; refused, the message next to its field."""
    form = QuotaForm(request.POST or None, initial=quota_values(**target), inherited=inherited)
    if request.method == "POST" and form.is_valid():
        try:
            quota_set(changes=form.cleaned_data, **target)
        except ConsoleError as exc:
            _form_error(request, form, exc)
        else:
            messages.success(request, f"Saved the quota of {subject}: {quota_summary(in_force())}.")
            return redirect("console:tokens")
    context = {
        "page": "tokens",
        "form": form,
        "subject": subject,
        "is_role": "role" in target,
        "in_force": quota_summary(in_force()),
    }
    return _render(request, "console/quota_edit.html", context)


def _shown(name: str, value: int | None) -> str:
    if name == "priority":
        return str(DEFAULT_PRIORITY if value is None else value)
    return "no limit" if not value else str(value)


def quota_summary(limits: Limits) -> str:
    """Limits in force in a few words: ``60 req/min · 10k tok/day · prio 7``, or ``no
    limits`` (the priority is shown when it is not the default)."""
    parts = [
        f"{_short(value)} {unit}"
        for value, unit in (
            (limits.requests_per_minute, "req/min"),
            (limits.tokens_per_minute, "tok/min"),
            (limits.tokens_per_day, "tok/day"),
            (limits.concurrent_sessions, "sessions"),
        )
        if value
    ]
    if limits.max_tokens:
        parts.append(f"max_tokens {_short(limits.max_tokens)}")
    if limits.priority != DEFAULT_PRIORITY:
        parts.append(f"prio {limits.priority}")
    return " · ".join(parts) or "no limits"


def _short(number: int) -> str:
    """``950``, ``10k``, ``1.5k``, ``2M``, ``1.2G`` (one decimal at most)."""
    for size, suffix in ((10**9, "G"), (10**6, "M"), (10**3, "k")):
        if number >= size:
            return f"{number / size:.1f}".removesuffix(".0") + suffix
    return str(number)
