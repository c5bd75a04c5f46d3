"""Admin API for quotas (``/api/quotas``), django-ninja ``Router``: viewers read, admins set.

A token's limit left blank (null) inherits its role's default; a role's blank is no limit; 0 is
no limit. Bodies are partial: a limit left out stays as it is, null blanks it. Errors: 422
naming the field (``Invalid``), 404 for an unknown token or role (``NotFound``).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Field, Router, Schema
from pydantic import ConfigDict, StrictInt

from console.lib.access import NEEDS_ADMIN, NEEDS_VIEWER
from console.lib.errors import NotFound
from console.models import Role
from inference import tokens
from inference.models import ApiToken
from inference.usage.quotas import (
    limits_as_dict,
    limits_for,
    quota_set,
    quota_table,
)

router = Router()

_DOCS = {
    "requests_per_minute": "requests admitted per minute (fixed window, UTC)",
    "tokens_per_minute": "prompt plus completion tokens per minute",
    "tokens_per_day": "prompt plus completion tokens per UTC day",
    "concurrent_sessions": "sessions with a turn in flight at once",
    "max_tokens": "the most max_tokens a request may ask (its default when it asks none)",
    "priority": "0-9, higher waits less when the control plane is full (default 5)",
}


class QuotaValuesOut(Schema):
    """Stored values: null is blank (a token's inherits its role's default; a role's is no
    limit); 0 is no limit."""

    requests_per_minute: int | None = Field(None, description=_DOCS["requests_per_minute"])
    tokens_per_minute: int | None = Field(None, description=_DOCS["tokens_per_minute"])
    tokens_per_day: int | None = Field(None, description=_DOCS["tokens_per_day"])
    concurrent_sessions: int | None = Field(None, description=_DOCS["concurrent_sessions"])
    max_tokens: int | None = Field(None, description=_DOCS["max_tokens"])
    priority: int | None = Field(None, description=_DOCS["priority"])


class LimitsOut(QuotaValuesOut):
    """The limits in force: null is no limit; ``priority`` always has a value."""

    priority: int = Field(5, description=_DOCS["priority"])


class QuotaIn(Schema):
    """A partial change: a limit left out stays as it is, null blanks it."""

    model_config = ConfigDict(extra="forbid")

    requests_per_minute: StrictInt | None = Field(None, description=_DOCS["requests_per_minute"])
    tokens_per_minute: StrictInt | None = Field(None, description=_DOCS["tokens_per_minute"])
    tokens_per_day: StrictInt | None = Field(None, description=_DOCS["tokens_per_day"])
    concurrent_sessions: StrictInt | None = Field(None, description=_DOCS["concurrent_sessions"])
    max_tokens: StrictInt | None = Field(None, description=_DOCS["max_tokens"])
    priority: StrictInt | None = Field(None, description=_DOCS["priority"])


class QuotaSetOut(Schema):
    values: QuotaValuesOut = Field(description="what is stored now (null: blank)")
    in_force: LimitsOut = Field(description="the limits in force now")


class TokenQuotaOut(Schema):
    token_id: int
    name: str
    role: str
    revoked: bool
    values: QuotaValuesOut
    in_force: LimitsOut


class QuotasOut(Schema):
    roles: dict[str, QuotaValuesOut] = Field(description="each role's default, by role")
    tokens: list[TokenQuotaOut] = Field(description="every token, by id")


@router.get(
    "/quotas",
    response=QuotasOut,
    tags=["quotas"],
    summary="Every role's default quota and every token's quota with its limits in force",
    auth=NEEDS_VIEWER,
)
def quotas_list(request: HttpRequest) -> dict[str, Any]:
    table = quota_table()
    for row in table["tokens"]:
        row["in_force"] = limits_as_dict(row["in_force"])
    return table


@router.put(
    "/quotas/roles/{role}",
    response=QuotaSetOut,
    tags=["quotas"],
    summary="Set a role's default quota (partial: a limit left out stays, null blanks it)",
    auth=NEEDS_ADMIN,
)
def quota_role_set(request: HttpRequest, role: str, payload: QuotaIn) -> dict[str, Any]:
    if role not in Role.values:
        raise NotFound(
            f"No role {role!r} (one of {', '.join(Role.values)}).", code="role_not_found"
        )
    values = quota_set(changes=payload.model_dump(exclude_unset=True), role=role)
    return {"values": values, "in_force": limits_as_dict(limits_for(role=role))}


@router.put(
    "/quotas/tokens/{token_id}",
    response=QuotaSetOut,
    tags=["quotas"],
    summary="Set a token's quota (partial: a limit left out stays, null inherits its role's)",
    auth=NEEDS_ADMIN,
)
def quota_token_set(request: HttpRequest, token_id: int, payload: QuotaIn) -> dict[str, Any]:
    token = ApiToken.objects.filter(pk=token_id).first() if 0 < token_id < 2**63 else None
    if token is None:
        raise NotFound(f"No token {token_id}.", code="token_not_found")
    values = quota_set(changes=payload.model_dump(exclude_unset=True), token_id=token.pk)
    role = tokens.token_role(token).value
    return {
        "values": values,
        "in_force": limits_as_dict(limits_for(role=role, token_id=token.pk)),
    }
