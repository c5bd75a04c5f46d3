"""Admin API for API tokens (``/api/tokens``), django-ninja ``Router``: admin only; the
plaintext of a new token is returned once. A token's role is the console's (``Role``)."""

from __future__ import annotations

from datetime import datetime

from django.http import HttpRequest
from ninja import Field, Router, Schema

from console.lib.access import NEEDS_ADMIN
from console.lib.errors import Invalid
from console.models import Role
from inference import tokens
from inference.models import ApiToken
from inference.usage.quota_api import LimitsOut
from inference.usage.quotas import limits_as_dict, limits_for

router = Router()


class TokenOut(Schema):
    id: int
    name: str
    prefix: str
    role: str
    revoked: bool
    created_at: datetime
    last_used_at: datetime | None
    created_by: str | None
    cache_answers: bool = Field(description="its stateless requests use cached answers")
    quota: LimitsOut = Field(description="its limits in force (set at /api/quotas/tokens/{id})")


class TokenIn(Schema):
    name: str
    role: Role = Role.VIEWER


class TokenCreatedOut(TokenOut):
    token: str = Field(description="the plaintext, shown this once")


def _token_out(token: ApiToken) -> dict:
    role = tokens.token_role(token).value
    return {
        "id": token.pk,
        "name": token.name,
        "prefix": token.prefix,
        "role": role,
        "revoked": token.revoked,
        "created_at": token.created_at,
        "last_used_at": token.last_used_at,
        "created_by": token.created_by.get_username() if token.created_by else None,
        "cache_answers": token.cache_answers,
        "quota": limits_as_dict(limits_for(role=role, token_id=token.pk)),
    }


@router.get(
    "/tokens", response=list[TokenOut], tags=["tokens"], summary="List API tokens", auth=NEEDS_ADMIN
)
def tokens_list(request: HttpRequest) -> list[dict]:
    return [_token_out(t) for t in tokens.tokens_all()]


@router.post(
    "/tokens",
    response={201: TokenCreatedOut},
    tags=["tokens"],
    summary="Create an API token (the plaintext is in this answer only)",
    auth=NEEDS_ADMIN,
)
def tokens_create(request: HttpRequest, payload: TokenIn) -> tuple[int, dict]:
    principal = request.auth
    token, plaintext = tokens.token_issue(
        name=payload.name, role=payload.role, created_by_id=principal.user_id
    )
    return 201, {**_token_out(token), "token": plaintext}


@router.delete(
    "/tokens/{token_id}",
    response=TokenOut,
    tags=["tokens"],
    summary="Revoke an API token",
    auth=NEEDS_ADMIN,
)
def tokens_revoke(request: HttpRequest, token_id: int) -> dict:
    return _token_out(tokens.token_withdraw(token_id=_token_id(token_id)))


class TokenPatchIn(Schema):
    cache_answers: bool = Field(description="opt its stateless requests in to cached answers")


@router.patch(
    "/tokens/{token_id}",
    response=TokenOut,
    tags=["tokens"],
    summary="Change an API token's settings (cached answers)",
    auth=NEEDS_ADMIN,
)
def tokens_change(request: HttpRequest, token_id: int, payload: TokenPatchIn) -> dict:
    return _token_out(
        tokens.token_set_cache_answers(
            token_id=_token_id(token_id), cache_answers=payload.cache_answers
        )
    )


def _token_id(token_id: int) -> int:
    """A token id from a path, checked where it enters: ``Invalid`` (422) unless positive."""
    if token_id < 1:
        raise Invalid("token_id: must be positive.", field="token_id")
    return token_id
