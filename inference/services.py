"""Packages, API tokens and the session routing table: everything that writes them.

Functions are synchronous (ORM); async edges call them through ``sync_to_async``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from inference.errors import AuthError, NoHealthyNode, UnknownModel
from inference.models import ApiToken, ModelPackage, RouteDecision, RoutingPolicy, SessionRoute
from inference.routing import Decision, NoNodeAvailable, route_request
from nodes.models import Node
from nodes.selectors import nodes_for_routing

ENV_TOKEN = "PHALANX_API_TOKEN"
TOKEN_PREFIX = "phx_"


class PackageConflict(Exception):
    """``name:version`` exists with another file; packages are immutable."""


# --- packages -------------------------------------------------------------------------------


def package_register(
    *,
    name: str,
    version: str,
    gguf_path: str,
    sha256: str,
    quantization: str = "",
    architecture: str = "",
    context_window: int = 2048,
    chat_template: str = "",
) -> tuple[ModelPackage, bool]:
    """Register a package version (idempotent); returns ``(package, created)``.

    Raises ``PackageConflict`` when ``name:version`` exists with another sha256.
    """
    existing = ModelPackage.objects.filter(name=name, version=version).first()
    if existing is not None:
        if existing.sha256 != sha256:
            raise PackageConflict(f"{existing.key} exists with sha256 {existing.sha256[:12]}…")
        return existing, False
    package = ModelPackage.objects.create(
        name=name,
        version=version,
        gguf_path=gguf_path,
        sha256=sha256,
        quantization=quantization,
        architecture=architecture,
        context_window=context_window,
        chat_template=chat_template,
    )
    return package, True


def package_resolve(*, model: str) -> ModelPackage:
    """The package a client's ``model`` names: ``name`` (newest version) or ``name:version``.

    Raises ``UnknownModel`` naming the model.
    """
    name, _, version = model.strip().partition(":")
    packages = ModelPackage.objects.filter(name=name)
    if version:
        packages = packages.filter(version=version)
    package = packages.order_by("-created_at", "-id").first()
    if package is None:
        raise UnknownModel(
            f"The model {model!r} does not exist; GET /v1/models lists the "
            f"models this array serves.",
            param="model",
        )
    return package


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
    """Revoke a token; it stops working on the next request."""
    ApiToken.objects.filter(pk=token_id).update(revoked=True)


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


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, or None."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


# --- routing table --------------------------------------------------------------------------


@dataclass(frozen=True)
class RouteTarget:
    """Where to send one attempt of a request: node id and address, the package name the node
    serves (sent as ``model``), and the routing decision."""

    node_id: str
    address: str
    model: str
    decision: Decision


def route_resolve(
    *,
    session_id: str | None,
    model: str,
    exclude: Mapping[str, str] | None = None,
    new_turn: bool = True,
) -> RouteTarget:
    """Pick the node for a request for package ``model`` and record pins and moves.

    Without ``session_id`` the request is routed by load and nothing is stored. With one, the
    session's route is created or updated in one transaction: placed and moved decisions are
    appended to its log, ``moves`` counts redirects, ``turns`` counts requests (only when
    ``new_turn``; retries of the same request pass False). ``exclude`` maps node ids that failed
    this request to a reason. Raises ``NoHealthyNode`` (with ``retry_after`` in seconds).
    """
    policy = RoutingPolicy.load()
    nodes, addresses = nodes_for_routing(stale_after_s=max(3 * policy.health_interval_s, 10.0))
    retry_after = max(1, round(policy.health_interval_s))
    if session_id is None:
        try:
            decision = route_request(nodes, model=model, session=False, exclude=exclude)
        except NoNodeAvailable as exc:
            raise NoHealthyNode(str(exc), retry_after=retry_after) from exc
        return RouteTarget(decision.node_id, addresses[decision.node_id], model, decision)
    with transaction.atomic():
        route, _ = SessionRoute.objects.select_for_update().get_or_create(session_id=session_id)
        pinned = route.node.node_id if route.node_id else None
        try:
            decision = route_request(nodes, model=model, pinned=pinned, exclude=exclude)
        except NoNodeAvailable as exc:
            raise NoHealthyNode(str(exc), retry_after=retry_after) from exc
        if decision.pins:
            route.node = Node.objects.get(node_id=decision.node_id)
            if route.package_id is None or decision.action == "placed":
                route.package_id = route.node.package_id
            if decision.action == "moved":
                route.moves += 1
            RouteDecision.objects.create(
                route=route,
                action=decision.action,
                node_id=decision.node_id,
                reason=decision.reason,
            )
        if new_turn:
            route.turns += 1
        route.save()
    return RouteTarget(decision.node_id, addresses[decision.node_id], model, decision)


def transcript_get(*, session_id: str) -> list[dict[str, Any]]:
    """The stored transcript of a session (empty for a new one)."""
    route = SessionRoute.objects.filter(session_id=session_id).only("transcript").first()
    return list(route.transcript) if route else []


@transaction.atomic
def transcript_append(*, session_id: str, messages: list[dict[str, Any]]) -> int:
    """Append OpenAI messages to a session's transcript (creating the route if needed);
    returns the transcript's new length in messages."""
    route, _ = SessionRoute.objects.select_for_update().get_or_create(session_id=session_id)
    route.transcript = [*route.transcript, *messages]
    route.save(update_fields=["transcript", "last_seen_at"])
    return len(route.transcript)


def session_package_name(*, session_id: str) -> str | None:
    """Name of the package a session started on, or None for a new session."""
    route = SessionRoute.objects.filter(session_id=session_id).select_related("package").first()
    return route.package.name if route and route.package else None
