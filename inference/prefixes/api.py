"""``/api/prefixes``: shared prefixes registered by operators (docs/engine.md, "Registered prefixes"): the list
with the nodes holding each (viewers), registration and removal (operators, audited)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest
from ninja import Field, Router, Schema

from console.lib.access import NEEDS_OPERATOR, NEEDS_VIEWER
from inference.prefixes import services

router = Router(tags=["shared prefixes"])


class PrefixIn(Schema):
    model_config = {"extra": "forbid"}  # a misspelt field is a 422 naming it, not ignored

    name: str = Field(pattern=r"^[-a-zA-Z0-9_]{1,64}$", description="a slug naming the agent")
    model: str = Field("", description="the model clients ask for; empty: every model")
    system: str = Field(description="the agent's system prompt, as its requests send it")
    tools: list[dict[str, Any]] = Field(
        default_factory=list, description="the agent's tools, OpenAI's shape"
    )


class PrefixOut(Schema):
    name: str
    model: str
    agent: str = Field(description="the agent fingerprint nodes publish when they hold it")
    system: str
    tools: list[dict[str, Any]]
    created_at: datetime
    held_by: list[str] = Field(description="nodes that hold its KV (publish its agent)")
    waiting: list[str] = Field(description="nodes serving its model that are still to get it")


def _out(view: services.PrefixView) -> dict:
    prefix = view.prefix
    return {
        "name": prefix.name,
        "model": prefix.model,
        "agent": prefix.agent,
        "system": prefix.system,
        "tools": prefix.tools,
        "created_at": prefix.created_at,
        "held_by": view.held_by,
        "waiting": view.waiting,
    }


@router.get(
    "/prefixes",
    response=list[PrefixOut],
    summary="Registered shared prefixes and the nodes that hold them",
    auth=NEEDS_VIEWER,
)
def prefixes_list(request: HttpRequest) -> list[dict]:
    return [_out(view) for view in services.prefixes_overview()]


@router.post(
    "/prefixes",
    response={201: PrefixOut},
    summary="Register an agent's opening: nodes serving its model prefill and keep it",
    auth=NEEDS_OPERATOR,
)
def prefixes_register(request: HttpRequest, payload: PrefixIn) -> tuple[int, dict]:
    prefix = services.prefix_register(
        name=payload.name,
        model=payload.model,
        system=payload.system,
        tools=payload.tools,
        created_by_id=request.auth.user_id,
    )
    return 201, _out(services.PrefixView(prefix))


@router.delete(
    "/prefixes/{name}",
    response={204: None},
    summary="Stop sending a prefix (nodes keep what they hold until it is displaced)",
    auth=NEEDS_OPERATOR,
)
def prefixes_remove(request: HttpRequest, name: str) -> tuple[int, None]:
    services.prefix_remove(name=name)
    return 204, None
