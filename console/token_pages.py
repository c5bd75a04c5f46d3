"""The Tokens page (admins): the API tokens, issuing one (its plaintext shown in that one
answer only) and revoking one."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from console.forms import TokenForm
from console.lib.access import role_required
from console.lib.errors import ConsoleError
from console.models import Role
from console.views import _flash_error, _render
from inference import tokens as token_services


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
            "tokens": token_services.tokens_all(),
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
