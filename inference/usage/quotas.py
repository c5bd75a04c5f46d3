"""Quotas: the limits of an API token, or the default of a role, and who a request counts
against (``Caller``). Set on the Tokens page, at ``/api/quotas`` and in the config file's
``quotas:`` section; read on the hot path through ``inference.lookups`` (cached).

A token's limit left blank inherits its role's default; a role's left blank is no limit; 0 is
no limit. Errors: ``Invalid`` (422, naming the field), ``NotFound``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from django.db import transaction

from console.lib.audit import audit_record
from console.lib.errors import Invalid, NotFound
from console.models import Role
from inference.models import ApiToken, Quota

DEFAULT_PRIORITY = 5
MAX_PRIORITY = 9


@dataclass(frozen=True)
class Limits:
    """A caller's limits in force (None: no limit). Windows: a minute and a UTC day, fixed
    (``inference.usage.limits``). ``concurrent_sessions``: sessions with a turn in flight."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    tokens_per_day: int | None = None
    concurrent_sessions: int | None = None
    max_tokens: int | None = None
    priority: int = DEFAULT_PRIORITY

    @property
    def limited(self) -> bool:
        """Whether any counted limit applies (else admission costs nothing)."""
        return any(
            (
                self.requests_per_minute,
                self.tokens_per_minute,
                self.tokens_per_day,
                self.concurrent_sessions,
            )
        )


NO_LIMITS = Limits()


@dataclass(frozen=True)
class Caller:
    """Whom a turn counts against: ``key`` (``token:<id>``, ``user:<name>`` or ``env``),
    ``name`` for people, the role, and the limits in force."""

    key: str
    name: str
    role: str
    limits: Limits = NO_LIMITS
    token_id: int | None = None


def merged(token_row: dict[str, Any] | None, role_row: dict[str, Any] | None) -> Limits:
    """The limits in force from a token's quota values and its role's (``Quota.LIMITS``
    keys; None inherits, 0 means no limit). Pure."""
    values: dict[str, Any] = {}
    for name in Quota.LIMITS:
        own = (token_row or {}).get(name)
        value = own if own is not None else (role_row or {}).get(name)
        if name == "priority":
            values[name] = DEFAULT_PRIORITY if value is None else int(value)
        else:
            values[name] = int(value) if value else None
    return Limits(**values)


def _row(quota: Quota | None) -> dict[str, Any] | None:
    return {n: getattr(quota, n) for n in Quota.LIMITS} if quota else None


def limits_for(*, role: str, token_id: int | None = None) -> Limits:
    """The limits in force for a token (``token_id``) acting with ``role``, or for a
    console user or the environment's token with ``role`` (no token row)."""
    own = Quota.objects.filter(token_id=token_id).first() if token_id else None
    return merged(_row(own), _row(Quota.objects.filter(role=role).first()))


def quota_values(*, token_id: int | None = None, role: str = "") -> dict[str, Any]:
    """The stored values (None where blank) of a token's quota or a role's default."""
    quota = _quota(token_id=token_id, role=role, create=False)
    return _row(quota) or dict.fromkeys(Quota.LIMITS)


INT_TOP = 2_147_483_647  # the largest value of the 32-bit integer columns (PostgreSQL integer)
_TOPS = {"priority": MAX_PRIORITY, "tokens_per_day": 2**40}


def _check(changes: dict[str, Any]) -> dict[str, int | None]:
    checked: dict[str, int | None] = {}
    for name, value in changes.items():
        if name not in Quota.LIMITS:
            raise Invalid(f"{name}: not a quota (one of {', '.join(Quota.LIMITS)}).", field=name)
        if value is None or value == "":
            checked[name] = None
            continue
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise Invalid(f"{name}: give a whole number or leave it blank.", field=name)
        try:
            number = int(value)
        except ValueError:
            raise Invalid(f"{name}: {value!r} is not a whole number.", field=name) from None
        top = _TOPS.get(name, INT_TOP)
        if not 0 <= number <= top:
            raise Invalid(f"{name}: must be between 0 and {top}.", field=name)
        checked[name] = number
    return checked


def _quota(*, token_id: int | None, role: str, create: bool) -> Quota | None:
    if token_id is not None:
        if not ApiToken.objects.filter(pk=token_id).exists():
            raise NotFound(f"No token {token_id}.", code="token_not_found")
        lookup: dict[str, Any] = {"token_id": token_id}
    elif role in Role.values:
        lookup = {"role": role}
    else:
        raise Invalid(f"role: {role!r} is not a role ({', '.join(Role.values)}).", field="role")
    if create:
        return Quota.objects.get_or_create(**lookup)[0]
    return Quota.objects.filter(**lookup).first()


@transaction.atomic
def quota_set(
    *, changes: dict[str, Any], token_id: int | None = None, role: str = ""
) -> dict[str, Any]:
    """Set limits (``Quota.LIMITS`` names; None/"" blank) of token ``token_id`` or of the
    default of ``role``; audited; returns the stored values. Takes effect within
    ``inference.lookups.TTL_S`` on other processes (at once with Redis and on this one).
    Raises ``Invalid`` naming the field, ``NotFound`` for an unknown token."""
    checked = _check(changes)
    quota = _quota(token_id=token_id, role=role, create=True)
    assert quota is not None
    before = _row(quota) or {}
    for name, value in checked.items():
        setattr(quota, name, value)
    quota.save()
    target = f"token:{token_id}" if token_id is not None else f"role:{role}"
    moved = [f"{n}: {before.get(n)} -> {v}" for n, v in checked.items() if before.get(n) != v]
    audit_record(action="quota.set", target=target, changes=moved)
    return _row(quota) or {}


def limits_as_dict(limits: Limits) -> dict[str, Any]:
    return {f.name: getattr(limits, f.name) for f in fields(limits)}


def quota_check(changes: dict[str, Any]) -> dict[str, int | None]:
    """``changes`` as ``quota_set`` would store them (None blank), without storing: for
    callers that check a whole document first (the config file). Raises ``Invalid`` naming
    the field."""
    return _check(changes)


def quota_token_named(*, name: str) -> int:
    """The id of the one token (not revoked) named ``name``: the config file names tokens.
    Raises ``NotFound`` (none) or ``Invalid`` (several: names are not unique)."""
    ids = list(
        ApiToken.objects.filter(name=name, revoked=False)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    if not ids:
        raise NotFound(f"no token named {name!r} (not revoked).", code="token_not_found")
    if len(ids) > 1:
        raise Invalid(
            f"{len(ids)} tokens are named {name!r} (ids {', '.join(map(str, ids))}): "
            "rename or revoke all but one, or set its quota on the Tokens page.",
            code="token_ambiguous",
            field="name",
        )
    return ids[0]


def quota_table() -> dict[str, Any]:
    """Every role's default and every token's quota, in two queries: ``{"roles": {role:
    values}, "tokens": [{"token_id", "name", "role", "revoked", "values", "in_force"}]}``
    (``values`` as ``quota_values``, ``in_force`` a ``Limits``), tokens by id."""
    stored = {q.role: _row(q) for q in Quota.objects.exclude(role="")}
    roles = {r: stored.get(r) or dict.fromkeys(Quota.LIMITS) for r in Role.values}
    rows = []
    for token in ApiToken.objects.select_related("console_role", "quota").order_by("pk"):
        own_role = getattr(token, "console_role", None)
        role = own_role.role if own_role else Role.OPERATOR.value
        values = _row(getattr(token, "quota", None)) or dict.fromkeys(Quota.LIMITS)
        rows.append(
            {
                "token_id": token.pk,
                "name": token.name,
                "role": role,
                "revoked": token.revoked,
                "values": values,
                "in_force": merged(values, roles[role]),
            }
        )
    return {"roles": roles, "tokens": rows}
