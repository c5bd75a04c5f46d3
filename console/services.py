"""What the console and the admin API change: nodes, drains, tokens with roles, packages, the
routing policy. Each wraps the owning app's service (``nodes.services``, ``inference.services``)
and sends the live event for what it changed (``nodes.live``).

Errors: ``console.lib.errors.Invalid`` (names the field), ``NotFound``, ``Conflict``.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from console.lib.audit import acting_as, audit_record, current_actor, diff
from console.lib.errors import Conflict, Invalid, NotFound
from inference.models import ModelPackage
from inference.packages import services as package_services
from nodes import device_validation, joining
from nodes import services as node_services
from nodes.live import live_node_changed, live_node_removed
from nodes.models import Node, NodeEvent, ValidationRun

NODE_FIELDS = (
    "kind",
    "served_name",
    "address",
    "package_id",
    "weight",
    "affinity",
    "cpu_set",
    "threads",
    "weight_measured",
)


def invalid_from(exc: ValidationError) -> Invalid:
    """The first message of a Django ``ValidationError`` as ``Invalid`` naming its field."""
    if hasattr(exc, "message_dict"):
        field, messages = next(iter(exc.message_dict.items()))
        name = None if field == "__all__" else field
        return Invalid(f"{name}: {messages[0]}" if name else messages[0], field=name)
    return Invalid(exc.messages[0])


def _node(node_id: str) -> Node:
    node = Node.objects.select_related("package").filter(node_id=node_id).first()
    if node is None:
        raise NotFound(f"No node {node_id!r}.", code="node_not_found")
    return node


def _check_node(node: Node, *, package_changed: bool = True) -> None:
    if node.kind == Node.Kind.EXTERNAL and not (node.served_name or "").strip():
        raise Invalid(
            "served_name: an external node needs the model name it serves (what its "
            "/v1/models lists, or an alias clients ask for)",
            field="served_name",
        )
    if node.kind == Node.Kind.EXTERNAL and node.package_id is not None:
        raise Invalid(
            "package: an external node serves its own model and takes no package (upgrades "
            "roll our packages over our nodes only)",
            field="package_id",
        )
    if node.package_id is not None:
        package = ModelPackage.objects.filter(pk=node.package_id).first()
        if package is None:
            raise Invalid(f"package: no package with id {node.package_id}.", field="package_id")
        if package_changed:
            package_services.package_check_deployable(package)
    try:
        node.full_clean(exclude=["package", "state", "last_seen_load"], validate_unique=False)
    except ValidationError as exc:
        raise invalid_from(exc) from exc


@transaction.atomic
def node_create(
    *,
    node_id: str,
    address: str,
    package_id: int | None = None,
    weight: float = 1.0,
    affinity: bool = True,
    cpu_set: str = "",
    threads: int = 1,
    weight_measured: bool = True,
    kind: str = Node.Kind.PHALANX,
    served_name: str = "",
) -> Node:
    """Register a new node (state ``unknown`` until the control loop probes it).

    Raises ``Conflict`` when ``node_id`` exists, ``Invalid`` for a bad field.
    """
    if Node.objects.filter(node_id=node_id).exists():
        raise Conflict(f"Node {node_id!r} exists already.", code="node_exists", field="node_id")
    draft = Node(
        node_id=node_id,
        address=address,
        package_id=package_id,
        weight=weight,
        affinity=affinity,
        cpu_set=cpu_set,
        threads=threads,
        weight_measured=weight_measured,
        kind=kind,
        served_name=served_name,
    )
    _check_node(draft)
    node, _ = node_services.node_upsert(
        by=current_actor(),
        node_id=node_id,
        address=address,
        package_id=package_id,
        cpu_set=cpu_set,
        threads=threads,
        weight=weight,
        affinity=affinity,
        weight_measured=weight_measured,
        kind=kind,
        served_name=served_name,
    )
    live_node_changed(node_id=node_id, event=node.events.first())
    audit_record(action="node.create", target=node_id, changes=diff({}, _node_settings(node)))
    return node


def _node_settings(node: Node) -> dict[str, Any]:
    return {f: getattr(node, f) for f in NODE_FIELDS}


@transaction.atomic
def node_update(*, node_id: str, changes: dict[str, Any]) -> Node:
    """Change some of a node's ``NODE_FIELDS``; a new address or package resets its state to
    ``unknown`` (see ``nodes.services.node_upsert``). Raises ``NotFound``, ``Invalid``."""
    node = _node(node_id)
    unknown = set(changes) - set(NODE_FIELDS)
    if unknown:
        field = sorted(unknown)[0]
        raise Invalid(f"{field}: not a field you can change.", field=field)
    draft = Node(**{f: getattr(node, f) for f in ("node_id", *NODE_FIELDS)})
    for key, value in changes.items():
        setattr(draft, key, value)
    _check_node(draft, package_changed=draft.package_id != node.package_id)
    node_services.node_upsert(
        node_id=node_id,
        address=draft.address,
        package_id=draft.package_id,
        cpu_set=draft.cpu_set,
        threads=draft.threads,
        weight=draft.weight,
        affinity=draft.affinity,
        weight_measured=draft.weight_measured,
        kind=draft.kind,
        served_name=draft.served_name if "served_name" in changes else None,
    )
    live_node_changed(node_id=node_id)
    after = _node(node_id)
    audit_record(
        action="node.update",
        target=node_id,
        changes=diff(_node_settings(node), _node_settings(after)),
    )
    return after


@transaction.atomic
def node_remove(*, node_id: str) -> None:
    """Delete a node and its events; sessions pinned to it are placed again at their next turn.
    Raises ``NotFound``."""
    node = _node(node_id)
    node.delete()
    live_node_removed(node_id=node_id)
    audit_record(action="node.remove", target=node_id)


def node_set_drained(*, node_id: str, drained: bool) -> NodeEvent | None:
    """Drain (no new sessions; pinned ones move at their next turn) or undrain a node; returns
    the event, or None when it already was so. Raises ``NotFound``."""
    _node(node_id)
    service = node_services.node_drain if drained else node_services.node_undrain
    return service(node_id=node_id, by=current_actor())  # it sends the live event and audits


@transaction.atomic
def node_restart(*, node_id: str) -> NodeEvent | None:
    """Ask the embedded array that started the node's agent to restart it, draining it first
    (``nodes.services.node_request_restart``); returns the drain event, or None when a
    restart is already asked for. Raises ``NotFound``, ``Conflict`` (not started by this
    array's ``up``: an external or remote node)."""
    before = _node(node_id).state
    try:
        event = node_services.node_request_restart(node_id=node_id, by=current_actor())
    except node_services.NotRestartable as exc:
        raise Conflict(f"{exc}.") from exc
    audit_record(
        action="node.restart",
        target=node_id,
        changes=diff({"state": before}, {"state": _node(node_id).state}),
    )
    return event


def node_validate(*, node_id: str) -> ValidationRun:
    """Validate a node now ("validate now"): queue a run, or return the one under way. The node
    takes no traffic until it ends (docs/validation.md). Raises ``NotFound``."""
    _node(node_id)
    run = device_validation.validation_request(
        node_id=node_id, trigger=ValidationRun.Trigger.DEMAND, requested_by=current_actor()
    )
    audit_record(action="node.validate", target=node_id, changes=[f"run {run.pk}"])
    return run


def node_waive_validation(*, node_id: str, reason: str) -> Node:
    """Let a node take traffic without passing validation, saying why (an external server that
    cannot validate). Raises ``NotFound``, ``Invalid`` (no reason)."""
    before = _node(node_id).validation
    try:
        node = device_validation.validation_waive(
            node_id=node_id, reason=reason, by=current_actor()
        )
    except ValueError as exc:
        raise Invalid(f"reason: {exc}.", field="reason") from exc
    audit_record(
        action="node.waive_validation",
        target=node_id,
        changes=diff({"validation": before}, {"validation": node.validation}) + [reason[:200]],
    )
    return node


@transaction.atomic
def node_join(
    *, join_token: str, node_id: str, address: str, package_id: int | None = None
) -> joining.JoinGrant:
    """Register a node that joins with a one-time ``join_token`` (``runnode --join``): the
    token is checked and spent, the node created as ``node_create`` would (same checks), and
    its ``JoinGrant`` returned. All or nothing: a refused field leaves the token unused.
    Raises ``JoinTokenRefused`` (401 unknown, 403 expired or used), ``Conflict`` (the id
    exists), ``Invalid`` (a bad field)."""
    token = joining.join_token_take(raw=join_token)
    with acting_as(f"join token {token.prefix}"):
        node = node_create(node_id=node_id, address=address, package_id=package_id)
    return joining.join_complete(token=token, node=node)


def join_token_mint(*, ttl_s: int, note: str = "") -> tuple[Any, str]:
    """A new one-time join token by the current actor: ``(row, plaintext)``. Raises
    ``Invalid`` (``ttl_s`` out of range)."""
    return joining.join_token_mint(ttl_s=ttl_s, note=note, by=current_actor())


def node_revoke_credential(*, node_id: str) -> NodeEvent:
    """Revoke a node's credential by the current actor (``nodes.joining``): it is down and
    refused at once. Raises ``NotFound``."""
    return joining.node_credential_revoke(node_id=node_id, by=current_actor())


# --- packages -------------------------------------------------------------------------------


def package_register_file(*, name: str, version: str, gguf_path: str) -> tuple[ModelPackage, bool]:
    """Import the GGUF file at ``gguf_path`` on this host as package ``name:version`` (copied
    into the package store, see ``inference.packages.services.package_import_file``);
    idempotent for the same file. Raises ``Invalid`` (missing file, bad name), ``BadFile``
    (not a GGUF), ``Conflict`` (``name:version`` exists with another file)."""
    try:
        path = package_services.check_import_path(gguf_path)
    except Invalid as exc:
        raise Invalid(exc.message.replace("path:", "gguf_path:", 1), field="gguf_path") from exc
    imported = package_services.package_import_file(
        path=path, name=name, version=version, source={"kind": "import", "from": f"file {path}"}
    )
    return imported.package, imported.created
