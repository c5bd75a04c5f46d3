"""What every operator page shares: the frame it renders in (the navigation, the principal
and its role flags, the state colours) and how a service's refusal shows on a page. The pages
themselves are the ``console/*_pages.py`` modules; health, metrics and static files are
``console/ops_views.py``."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from console.lib import access
from console.lib.errors import ConsoleError
from console.models import Role
from inference.alerts.models import Alert
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
    ("logs", "Logs"),
    ("cache", "Cache"),
    ("prefixes", "Prefixes"),
    ("usage", "Usage"),
    ("alerts", "Alerts"),
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
            "alerts_firing": Alert.objects.filter(state=Alert.State.FIRING).count(),
        },
        status=status,
    )


def _flash_error(request: HttpRequest, exc: ConsoleError) -> None:
    messages.error(request, exc.message)


def _form_error(request: HttpRequest, form: forms.Form, exc: ConsoleError) -> None:
    """The service's refusal, at the top of the page and at its field when the form has it."""
    messages.error(request, exc.message)
    if exc.field in form.fields:
        form.add_error(exc.field, exc.message)
