"""Admin API for model packages (``/api/packages``) and API tokens (``/api/tokens``).

Packages: viewer reads (with what the GGUF file says of itself), admin registers a GGUF file on
this host or removes an unused package. Tokens: admin only; the plaintext is returned once."""

from __future__ import annotations

from datetime import datetime

from django.http import HttpRequest
from ninja import Field, Router, Schema

from console import selectors, services
from console.access import NEEDS_ADMIN, NEEDS_VIEWER
from console.errors import Invalid, NotFound
from console.models import Role
from inference.models import ApiToken, ModelPackage

router = Router()


class PackageOut(Schema):
    id: int
    key: str = Field(description="name:version")
    name: str
    version: str
    gguf_path: str
    sha256: str
    quantization: str
    architecture: str
    context_window: int
    created_at: datetime
    nodes: int = Field(0, description="nodes serving it")


class GgufOut(Schema):
    exists: bool
    size_bytes: int | None
    architecture: str
    parameters: int | None
    quantization: str
    context_length: int | None
    chat_template: str
    tensors: int | None
    name: str
    error: str


class PackageDetailOut(PackageOut):
    chat_template: str
    gguf: GgufOut


class PackageIn(Schema):
    name: str
    version: str
    gguf_path: str = Field(description="path of the GGUF file on the control plane's host")


class TokenOut(Schema):
    id: int
    name: str
    prefix: str
    role: str
    revoked: bool
    created_at: datetime
    last_used_at: datetime | None
    created_by: str | None


class TokenIn(Schema):
    name: str
    role: Role = Role.VIEWER


class TokenCreatedOut(TokenOut):
    token: str = Field(description="the plaintext, shown this once")


def _package(pk: int) -> ModelPackage:
    package = ModelPackage.objects.filter(pk=pk).first()
    if package is None:
        raise NotFound(f"No package {pk}.", code="package_not_found")
    return package


def _package_out(package: ModelPackage) -> dict:
    return {
        "id": package.pk,
        "key": package.key,
        "name": package.name,
        "version": package.version,
        "gguf_path": package.gguf_path,
        "sha256": package.sha256,
        "quantization": package.quantization,
        "architecture": package.architecture,
        "context_window": package.context_window,
        "created_at": package.created_at,
        "nodes": package.nodes.count(),
    }


@router.get(
    "/packages",
    response=list[PackageOut],
    tags=["packages"],
    summary="List packages",
    auth=NEEDS_VIEWER,
)
def packages_list(request: HttpRequest) -> list[dict]:
    return [_package_out(p) for p in ModelPackage.objects.all()]


@router.get(
    "/packages/{package_id}",
    response=PackageDetailOut,
    tags=["packages"],
    summary="Show a package and what its GGUF file says",
    auth=NEEDS_VIEWER,
)
def packages_show(request: HttpRequest, package_id: int) -> dict:
    package = _package(package_id)
    facts = selectors.gguf_facts(package.gguf_path)
    return {
        **_package_out(package),
        "chat_template": package.chat_template,
        "gguf": {**facts.__dict__},
    }


@router.post(
    "/packages",
    response={200: PackageOut, 201: PackageOut},
    tags=["packages"],
    summary="Register a GGUF file as a package version (idempotent)",
    auth=NEEDS_ADMIN,
)
def packages_create(request: HttpRequest, payload: PackageIn) -> tuple[int, dict]:
    package, created = services.package_register_file(
        name=payload.name, version=payload.version, gguf_path=payload.gguf_path
    )
    return (201 if created else 200), _package_out(package)


@router.delete(
    "/packages/{package_id}",
    response={204: None},
    tags=["packages"],
    summary="Remove a package no node serves",
    auth=NEEDS_ADMIN,
)
def packages_delete(request: HttpRequest, package_id: int) -> tuple[int, None]:
    services.package_remove(package_id=package_id)
    return 204, None


def _token_out(token: ApiToken) -> dict:
    return {
        "id": token.pk,
        "name": token.name,
        "prefix": token.prefix,
        "role": services.token_role(token).value,
        "revoked": token.revoked,
        "created_at": token.created_at,
        "last_used_at": token.last_used_at,
        "created_by": token.created_by.get_username() if token.created_by else None,
    }


@router.get(
    "/tokens", response=list[TokenOut], tags=["tokens"], summary="List API tokens", auth=NEEDS_ADMIN
)
def tokens_list(request: HttpRequest) -> list[dict]:
    return [_token_out(t) for t in selectors.tokens()]


@router.post(
    "/tokens",
    response={201: TokenCreatedOut},
    tags=["tokens"],
    summary="Create an API token (the plaintext is in this answer only)",
    auth=NEEDS_ADMIN,
)
def tokens_create(request: HttpRequest, payload: TokenIn) -> tuple[int, dict]:
    principal = request.auth
    token, plaintext = services.token_issue(
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
    if token_id < 1:
        raise Invalid("token_id: must be positive.", field="token_id")
    return _token_out(services.token_withdraw(token_id=token_id))
