"""Access control: who is calling, with which role, and what that role may do.

Roles are Django groups named ``admin``, ``operator`` and ``viewer``; a superuser is an admin; a
logged-in user in no group has no role and sees nothing. An API token acts with the role in its
``console.TokenRole`` row (``operator`` when it has none); ``$PHALANX_API_TOKEN`` acts as admin.

What each role may do (each includes the ones below it):

- viewer: read every page and every ``GET`` of the admin API, use the playground;
- operator: drain and undrain nodes, edit the routing policy (and upgrades, load tests);
- admin: add, edit and remove nodes and packages, apply config, create and revoke tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, Group
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, JsonResponse
from ninja.security import HttpBearer, SessionAuth

from console.lib.audit import acting_as, set_actor
from console.lib.errors import Forbidden
from console.models import Role, TokenRole

ROLE_RANK = {Role.VIEWER: 1, Role.OPERATOR: 2, Role.ADMIN: 3}
DEFAULT_TOKEN_ROLE = Role.OPERATOR


@dataclass(frozen=True)
class Principal:
    """Who is calling: ``name`` (username or ``token:<name>``), ``role`` (None: no role),
    ``user_id`` (None for tokens)."""

    name: str
    role: Role | None
    user_id: int | None = None

    def can(self, needed: Role) -> bool:
        """True when this principal's role is ``needed`` or above."""
        return self.role is not None and ROLE_RANK[self.role] >= ROLE_RANK[needed]


def role_of_user(user: AbstractBaseUser | AnonymousUser | None) -> Role | None:
    """The strongest role of a user: superuser → admin, else its strongest role group."""
    if user is None or not user.is_authenticated:
        return None
    if getattr(user, "is_superuser", False):
        return Role.ADMIN
    names = set(user.groups.values_list("name", flat=True))  # type: ignore[union-attr]
    for role in (Role.ADMIN, Role.OPERATOR, Role.VIEWER):
        if role.value in names:
            return role
    return None


def principal_for_user(user: Any) -> Principal | None:
    """The principal of a logged-in user, or None when anonymous."""
    if user is None or not user.is_authenticated:
        return None
    return Principal(name=user.get_username(), role=role_of_user(user), user_id=user.pk)


@dataclass(frozen=True)
class TokenMatch:
    """What the tokens feature found for a Bearer token: the token's ``name`` and row id
    (``token_id``), or ``token_id`` None for the environment's own ``$PHALANX_API_TOKEN``."""

    name: str
    token_id: int | None


TokenResolver = Callable[[str | None], TokenMatch | None]
_token_resolvers: list[TokenResolver] = []


def register_token_resolver(resolver: TokenResolver) -> None:
    """Let ``resolver`` (raw token -> ``TokenMatch``, or None when missing, unknown or revoked)
    say whose a Bearer token is; the tokens feature registers its own in ``AppConfig.ready()``
    (the plumbing imports no app), the way ``AUTHENTICATION_BACKENDS`` work. The first that
    knows the token answers."""
    if resolver not in _token_resolvers:
        _token_resolvers.append(resolver)


def principal_for_token(raw: str | None) -> Principal | None:
    """The principal of a Bearer token, or None when missing, unknown or revoked."""
    found = next((m for m in (r(raw) for r in _token_resolvers) if m is not None), None)
    if found is None:
        return None
    if found.token_id is None:
        return Principal(name="token:env", role=Role.ADMIN)
    row = TokenRole.objects.filter(token_id=found.token_id).first()
    return Principal(name=f"token:{found.name}", role=Role(row.role) if row else DEFAULT_TOKEN_ROLE)


def user_set_role(*, user: Any, role: Role | None) -> None:
    """Put ``user`` in exactly the group of ``role`` (or in none), creating the group."""
    user.groups.remove(*Group.objects.filter(name__in=[r.value for r in Role]))
    if role is not None:
        group, _ = Group.objects.get_or_create(name=role.value)
        user.groups.add(group)


def require(principal: Principal | None, needed: Role) -> Principal:
    """``principal`` when it has ``needed`` or above; raises ``Forbidden`` otherwise."""
    if principal is None or not principal.can(needed):
        have = principal.role.value if principal and principal.role else "no role"
        raise Forbidden(f"This needs the {needed.value} role; you have {have}.")
    return principal


# --- the admin API (django-ninja) ----------------------------------------------------------


class TokenAuth(HttpBearer):
    """``Authorization: Bearer <token>`` on ``/api/``; ``request.auth`` is a ``Principal``.

    With ``needed`` set, a known token whose role is weaker raises ``Forbidden`` (403) here,
    before django-ninja reads the body: a caller without the role learns nothing from a 422."""

    def __init__(self, needed: Role | None = Role.VIEWER) -> None:
        super().__init__()
        self.needed = needed

    def authenticate(self, request: HttpRequest, token: str) -> Principal | None:
        return _with_role(principal_for_token(token), self.needed)


class UserAuth(SessionAuth):
    """A logged-in Django user (CSRF-checked on unsafe methods); ``request.auth`` is a
    ``Principal``. Without a logged-in user it answers None before the CSRF check, so an
    anonymous call is a 401, not CSRF's 403. ``needed`` as for ``TokenAuth``."""

    def __init__(self, needed: Role | None = Role.VIEWER) -> None:
        super().__init__()
        self.needed = needed

    def __call__(self, request: HttpRequest) -> Any:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        return super().__call__(request)

    def authenticate(self, request: HttpRequest, key: str | None) -> Principal | None:
        return _with_role(principal_for_user(request.user), self.needed)


def _with_role(principal: Principal | None, needed: Role | None) -> Principal | None:
    if principal is not None:
        set_actor(principal.name)  # the API operation runs in this request's context
    if principal is None or needed is None:
        return principal
    return require(principal, needed)


def role_auth(needed: Role | None) -> list[Any]:
    """django-ninja ``auth=`` for an operation that needs ``needed`` (None: any caller)."""
    return [TokenAuth(needed), UserAuth(needed)]


API_AUTH = role_auth(None)
NEEDS_VIEWER = role_auth(Role.VIEWER)
NEEDS_OPERATOR = role_auth(Role.OPERATOR)
NEEDS_ADMIN = role_auth(Role.ADMIN)


def token_or_login(view: Callable) -> Callable:
    """For ``/api/docs`` and ``/api/openapi.json``: a request with ``Authorization: Bearer``
    is let in when the token has a role (else 401 JSON); without one, login is required as on
    every page (a redirect to the login form), and a user in no role group gets 403."""
    page = role_required(Role.VIEWER)(view)

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        header = request.headers.get("Authorization")
        if header is None:
            return page(request, *args, **kwargs)
        scheme, _, raw = header.partition(" ")
        principal = principal_for_token(raw.strip()) if scheme.lower() == "bearer" else None
        if principal is None or not principal.can(Role.VIEWER):
            response = JsonResponse(
                {"detail": "Unknown, revoked or role-less token.", "code": "unauthorized"},
                status=401,
            )
            response["WWW-Authenticate"] = "Bearer"
            return response
        return view(request, *args, **kwargs)

    return wrapper


# --- pages -----------------------------------------------------------------------------------


def page_principal(request: HttpRequest) -> Principal:
    """The page caller's principal (pages are login-protected before this is called)."""
    principal = principal_for_user(request.user)
    assert principal is not None
    return principal


def role_required(needed: Role) -> Callable:
    """View decorator: login required (redirect), then ``needed`` role or 403."""

    def decorate(view: Callable) -> Callable:
        @login_required
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            principal = principal_for_user(request.user)
            if principal is None or not principal.can(needed):
                raise PermissionDenied(f"This needs the {needed.value} role.")
            request.principal = principal  # type: ignore[attr-defined]
            with acting_as(principal.name):
                return view(request, *args, **kwargs)

        return wrapper

    return decorate
