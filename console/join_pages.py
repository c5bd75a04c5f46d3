"""The Join tokens page (admins): mint a one-time token for a node on another host (its
plaintext and the ``runnode --join`` command line shown in that one answer only) and see the
recent ones; and revoking a node's credential from its page. docs/node-protocol.md."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from console import services
from console.forms import JoinTokenForm
from console.lib.access import role_required
from console.lib.errors import ConsoleError
from console.models import Role
from console.views import _flash_error, _render
from nodes import joining


@role_required(Role.ADMIN)
def join_tokens(request: HttpRequest) -> HttpResponse:
    """Recent join tokens; a new one's plaintext and command line are shown once (POST)."""
    form = JoinTokenForm(request.POST or None)
    minted = None
    if request.method == "POST" and form.is_valid():
        try:
            row, raw = services.join_token_mint(
                ttl_s=form.cleaned_data["ttl_minutes"] * 60, note=form.cleaned_data["note"]
            )
        except ConsoleError as exc:
            form.add_error(None, exc.message)
        else:
            base = request.build_absolute_uri("/").rstrip("/")
            minted = {"row": row, "token": raw, "command": joining.join_command(base, raw)}
            form = JoinTokenForm()
    context = {
        "page": "nodes",
        "tokens": joining.join_tokens_recent(),
        "form": form,
        "minted": minted,
    }
    return _render(request, "console/join_tokens.html", context)


@require_POST
@role_required(Role.ADMIN)
def node_revoke(request: HttpRequest, node_id: str) -> HttpResponse:
    """Revoke the node's credential: it is down and refused at once."""
    try:
        services.node_revoke_credential(node_id=node_id)
    except ConsoleError as exc:
        _flash_error(request, exc)
    else:
        messages.success(
            request, f"Revoked {node_id}'s credential: it is refused until it joins again."
        )
    return redirect("console:node", node_id=node_id)
