"""API tokens: mint one with a role, revoke it, say whose a Bearer token is.

Only a token's SHA-256 is stored; the plaintext is shown once. ``$PHALANX_API_TOKEN``, when
set, is accepted as an admin token too. ``console.lib.access`` learns whose a token is through
``token_match`` (registered in ``InferenceConfig.ready``); the proxy authenticates through
``inference.lookups`` (cached). Errors: ``AuthError`` (401), ``Invalid``, ``NotFound``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from console.lib.access import TokenMatch
from console.lib.audit import audit_record
from console.lib.errors import Invalid, NotFound
from console.models import Role, TokenRole
from inference.errors import AuthError
from inference.models import ApiToken
from inference.usage.quotas import Caller, limits_for

ENV_TOKEN = "PHALANX_API_TOKEN"
TOKEN_PREFIX = "phx_"


# --- API tokens -----------------------------------------------------------------------------


def _hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def token_create(*, name: str, created_by_id: int | None = None) -> tuple[ApiToken, str]:
    """Mint an API token; returns ``(token, plaintext)``. Only the hash is stored: show it once."""
    plaintext = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        name=name, token_hash=_hash(plaintext), prefix=plaintext[:10], created_by_id=created_by_id
    )
    return token, plaintext


def token_revoke(*, token_id: int) -> None:
    """Revoke a token; it stops working on this process's next request (``inference.lookups``
    caches tokens: other processes refuse it within ``lookups.TTL_S``)."""
    token = ApiToken.objects.filter(pk=token_id).first()
    if token is not None and not token.revoked:
        token.revoked = True
        token.save(update_fields=["revoked"])  # post_save clears the lookups cache


def token_authenticate(*, raw: str | None) -> str:
    """Check a Bearer token; returns a name for the caller (the token's name, or ``env`` for
    ``$PHALANX_API_TOKEN``). Raises ``AuthError`` when missing, unknown or revoked."""
    if not raw:
        raise AuthError(
            "Missing API token: send 'Authorization: Bearer <token>'.", code="missing_api_key"
        )
    env_token = os.environ.get(ENV_TOKEN)
    if env_token and hmac.compare_digest(raw.encode(), env_token.encode()):
        return "env"
    token = ApiToken.objects.filter(token_hash=_hash(raw)).first()
    if token is None or token.revoked:
        raise AuthError("Invalid API token." if token is None else "This API token was revoked.")
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > timedelta(minutes=1):
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.name


def token_caller(*, raw: str | None) -> Caller:
    """Whom a request with the Bearer token ``raw`` counts against, with its role and the
    limits in force (``inference.usage.quotas``). ``$PHALANX_API_TOKEN`` is ``env``, acting as
    admin. Raises ``AuthError`` as ``token_authenticate``."""
    name = token_authenticate(raw=raw)
    token = ApiToken.objects.filter(token_hash=_hash(raw or "")).first()
    if token is None:  # the environment's token
        return Caller("env", name, Role.ADMIN.value, limits_for(role=Role.ADMIN.value))
    role = token_role(token).value
    return Caller(
        f"token:{token.pk}", token.name, role, limits_for(role=role, token_id=token.pk), token.pk
    )


def token_caches_answers(*, raw: str) -> bool:
    """Whether the token ``raw`` opted its requests in to cached answers (``cache_answers``;
    False for ``$PHALANX_API_TOKEN`` and unknown tokens)."""
    return ApiToken.objects.filter(token_hash=_hash(raw), cache_answers=True).exists()


def token_match(raw: str | None) -> TokenMatch | None:
    """Whose token ``raw`` is, for the console's access control (``console.lib.access``
    registers this in ``InferenceConfig.ready``): the environment's ``$PHALANX_API_TOKEN``
    (``token_id`` None) or a token row; None when missing, unknown or revoked."""
    try:
        name = token_authenticate(raw=raw)
    except AuthError:
        return None
    env = os.environ.get(ENV_TOKEN)
    if name == "env" and env and raw and hmac.compare_digest(raw.encode(), env.encode()):
        return TokenMatch(name="env", token_id=None)
    token = ApiToken.objects.filter(token_hash=_hash(raw or "")).first()
    return TokenMatch(name=token.name, token_id=token.pk) if token else None


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, or None."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


@transaction.atomic
def token_issue(*, name: str, role: Role, created_by_id: int | None = None) -> tuple[ApiToken, str]:
    """Mint an API token acting with ``role``; returns ``(token, plaintext)``. Show the
    plaintext once: only its hash is stored. Raises ``Invalid`` for an empty name."""
    name = name.strip()
    if not name:
        raise Invalid("name: give the token a name.", field="name")
    if len(name) > 100:
        raise Invalid("name: at most 100 characters.", field="name")
    token, plaintext = token_create(name=name, created_by_id=created_by_id)
    TokenRole.objects.create(token=token, role=role)
    audit_record(action="token.create", target=f"token:{name}", changes=[f"role: {role.value}"])
    return token, plaintext


def token_withdraw(*, token_id: int) -> ApiToken:
    """Revoke a token (it stops working at once). Raises ``NotFound``."""
    token = ApiToken.objects.filter(pk=token_id).first()
    if token is None:
        raise NotFound(f"No token {token_id}.", code="token_not_found")
    token_revoke(token_id=token_id)
    token.refresh_from_db()
    audit_record(action="token.revoke", target=f"token:{token.name}")
    return token


def token_set_cache_answers(*, token_id: int, cache_answers: bool) -> ApiToken:
    """Opt a token's stateless requests in to (or out of) cached answers (docs/semcache.md);
    audited. Raises ``NotFound``."""
    token = ApiToken.objects.filter(pk=token_id).first()
    if token is None:
        raise NotFound(f"No token {token_id}.", code="token_not_found")
    token.cache_answers = cache_answers
    token.save(update_fields=["cache_answers"])  # post_save clears the lookups cache
    audit_record(
        action="token.cache_answers",
        target=f"token:{token.name}",
        changes=[f"cache_answers: {cache_answers}"],
    )
    return token


def token_role(token: ApiToken) -> Role:
    """The role a token acts with (``operator`` when it has no role row)."""
    row = TokenRole.objects.filter(token=token).first()
    return Role(row.role) if row else Role.OPERATOR


def tokens_all() -> list[ApiToken]:
    """Every API token with its role row and creator (the Tokens page, ``GET /api/tokens``)."""
    return list(ApiToken.objects.select_related("console_role", "created_by"))
