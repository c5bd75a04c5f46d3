"""Names that stay true across versions: what a client calls a model, and what it resolves to.

A client asks for a **family** (``smollm2-135m-instruct``), never for a quantization or a
version: an upgrade changes those under the name. The name a node is served under for clients
(``client_name``) is the family of its package, or, when an upgrade or an operator set the
node's ``served_name``, the family of that name (an upgrade across families keeps the name
its clients used). A request's ``model`` resolves (``model_resolve``) to such a name from:
the family itself, any package name of the family or ``name:version`` (old clients keep
working after an upgrade: the Q4_1 package's name finds the Q4_K_M nodes), a name some node
is served under, or the routing policy's ``model_aliases`` / ``default_model``. Which version
answers is routing's choice (a session's own version, else the upgrade's split); every answer
reports it (``X-Phalanx-Package``, ``system_fingerprint``, the websocket ``done`` event).
See docs/control-plane.md, "Model names".
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inference.models import ModelPackage

QUANT_SUFFIX = re.compile(r"[-_.](q\d(_[0-9a-z]+)*|f16|f32|bf16|iq\d\w*)$", re.IGNORECASE)


def family_of(name: str) -> str:
    """``smollm2-135m-instruct-q4_1`` -> ``smollm2-135m-instruct``: the name without a
    quantization suffix (unchanged when it has none)."""
    return QUANT_SUFFIX.sub("", name) or name


def client_name(*, served_name: str, package_name: str | None, family: str | None) -> str | None:
    """The name clients ask a node for: the family of its ``served_name`` when one is set
    (set by upgrades before names were families: an old package name, which is the family
    with a suffix), else its package's ``family`` (else the family of the package's name);
    None for a node without a package."""
    if served_name:
        return family_of(served_name)
    if not package_name:
        return None
    return family or family_of(package_name)


def package_key(name: str | None, version: str | None) -> str | None:
    """``name:version`` (None without a package)."""
    return f"{name}:{version}" if name else None


def model_resolve(*, model: str) -> str:
    """The client-facing name (``client_name``) a request's ``model`` asks for: a package
    ``name`` or ``name:version`` gives its family; a family, or a name a node is served
    under, itself; else what the policy's ``model_aliases`` map it to, else its
    ``default_model`` (each resolved the same way).

    Raises ``inference.errors.UnknownModel`` (404 ``model_not_found``, ``param`` model);
    ``BadRequest`` (400 ``model_not_chat``) when it names an embedding package (those answer
    ``/v1/embeddings``, never a chat)."""
    from inference.errors import UnknownModel
    from inference.models import RoutingPolicy

    name = _known(model)
    if name is None:
        policy = RoutingPolicy.load()
        target = (policy.model_aliases or {}).get(model.strip()) or policy.default_model
        name = _known(target) if target else None
    if name is None:
        raise UnknownModel(
            f"The model {model!r} does not exist; GET /v1/models lists the "
            f"models this array serves.",
            param="model",
        )
    return name


def _known(model: str) -> str | None:
    """The client-facing name ``model`` names in the inventory, or None."""
    from inference.models import ModelPackage
    from nodes.models import Node

    name, _, version = model.strip().partition(":")
    packages = ModelPackage.objects.filter(name=name)
    if version:
        packages = packages.filter(version=version)
    package = packages.order_by("-created_at", "-id").only("name", "family", "kind").first()
    if package is not None:
        _check_chat(model, {package.kind})
        return package.family or family_of(package.name)
    if version:
        return None
    kinds = set(ModelPackage.objects.filter(family=name).values_list("kind", flat=True))
    if kinds:
        _check_chat(model, kinds)
        return name
    names = ModelPackage.objects.filter(name__startswith=name).values_list("name", flat=True)
    if any(family_of(n) == name for n in names):  # a version without a family recorded
        return name
    served = Node.objects.filter(served_name=name).exists()
    return family_of(name) if served else None


def _check_chat(model: str, kinds: set[str]) -> None:
    """Raises ``BadRequest`` (400) when the packages ``model`` names (of ``kinds``) are all
    embedding packages."""
    from inference.errors import BadRequest
    from inference.models import ModelPackage

    if kinds == {ModelPackage.Kind.EMBEDDING}:
        raise BadRequest(
            f"{model.strip()!r} is an embedding model; use /v1/embeddings (chat completions "
            "need a chat model: GET /v1/models lists them with their kind).",
            code="model_not_chat",
            param="model",
        )


def package_resolve(*, model: str) -> ModelPackage:
    """The package a client's ``model`` names: ``name`` (newest version) or ``name:version``;
    else what the routing policy's ``model_aliases`` map it to; else the policy's
    ``default_model`` when one is set.

    Raises ``UnknownModel`` naming the model. (The package itself, for the config file;
    requests resolve to a name: ``model_resolve``.)
    """
    from inference.errors import UnknownModel
    from inference.models import RoutingPolicy

    package = package_named(model)
    if package is not None:
        return package
    policy = RoutingPolicy.load()
    target = (policy.model_aliases or {}).get(model.strip()) or policy.default_model
    package = package_named(target) if target else None
    if package is None:
        raise UnknownModel(
            f"The model {model!r} does not exist; GET /v1/models lists the "
            f"models this array serves.",
            param="model",
        )
    return package


def package_named(model: str) -> ModelPackage | None:
    """The package ``name`` (its newest version) or ``name:version`` names, or None."""
    from inference.models import ModelPackage

    name, _, version = model.strip().partition(":")
    packages = ModelPackage.objects.filter(name=name)
    if version:
        packages = packages.filter(version=version)
    return packages.order_by("-created_at", "-id").first()
