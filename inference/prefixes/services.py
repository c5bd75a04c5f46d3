"""Registering, listing and sending shared prefixes (``SharedPrefix``): an operator registers
an agent's opening (its system prompt and tool schemas) ahead of its traffic; every healthy
node serving its model is sent it (``prefixes_send_due``, a periodic of the control loop),
prefills it, keeps it on its prefix shelf and publishes its agent fingerprint, which
prefix-aware placement reads (docs/engine.md, "Registered prefixes").

Functions are synchronous (ORM and blocking HTTP to nodes).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

import httpx
from django.db import IntegrityError, transaction

from console.lib.audit import audit_record
from console.lib.errors import Conflict, Invalid, NotFound
from inference.agent_prefix import agent_fingerprint
from inference.chat_request import parse_chat_request
from inference.errors import BadRequest, UnknownModel
from inference.model_names import client_name, model_resolve
from inference.prefixes.models import SharedPrefix
from nodes import client as node_client
from nodes.models import Node
from nodes.selectors import takes_sessions

log = logging.getLogger(__name__)

MAX_REGISTERED = 8  # a node's shelf keeps 8 prefixes (inference.engine.warm.MAX_SAVED)
MAX_SYSTEM_CHARS = 64 * 1024
MAX_TOOLS_BYTES = 64 * 1024
SEND_TIMEOUT_S = 60.0  # a node prefills each opening it is sent before it answers


def prefix_register(
    *, name: str, model: str, system: str, tools: list[Any] | None, created_by_id: int | None = None
) -> SharedPrefix:
    """Register an agent's opening. ``model`` is a name clients ask for (resolved as a
    request's is; "" for every model); ``tools`` OpenAI tool objects (or None).

    Raises ``Invalid`` (422, ``field`` names the input) or ``Conflict`` (409: the name is
    taken, or ``MAX_REGISTERED`` are registered already)."""
    system, tools = _checked_opening(system, tools)
    model = _checked_model(model)
    prefix = SharedPrefix(
        name=name,
        model=model,
        system=system,
        tools=tools,
        agent=agent_fingerprint([{"role": "system", "content": system}], tools or None) or "",
        created_by_id=created_by_id,
    )
    try:
        with transaction.atomic():
            if SharedPrefix.objects.select_for_update().count() >= MAX_REGISTERED:
                raise Conflict(
                    f"{MAX_REGISTERED} prefixes are registered, as many as a node keeps: "
                    "remove one first.",
                    code="too_many_prefixes",
                )
            prefix.save()
            audit_record(
                action="prefix.register",
                target=name,
                changes=[f"model: {model or '(every model)'}", f"agent: {prefix.agent}"],
            )
    except IntegrityError as exc:
        raise Conflict(f"a prefix named {name!r} is registered already.", field="name") from exc
    return prefix


def _checked_opening(system: Any, tools: Any) -> tuple[str, list[Any]]:
    """``system`` and ``tools`` as a request would carry them; raises ``Invalid``."""
    if not isinstance(system, str) or not system.strip():
        raise Invalid("system: the system prompt must not be empty.", field="system")
    if len(system) > MAX_SYSTEM_CHARS:
        raise Invalid(f"system: at most {MAX_SYSTEM_CHARS:,} characters.", field="system")
    tools = tools or []
    if len(json.dumps(tools)) > MAX_TOOLS_BYTES:
        raise Invalid(f"tools: at most {MAX_TOOLS_BYTES:,} bytes of JSON.", field="tools")
    body: dict[str, Any] = {
        "model": "-",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "-"}],
    }
    if tools:
        body["tools"] = tools
    try:
        parse_chat_request(body)  # the same rules as a request's tools
    except BadRequest as exc:
        raise Invalid(exc.message, field=exc.param or "tools") from exc
    return system, tools


def _checked_model(model: str) -> str:
    if not model.strip():
        return ""
    try:
        return model_resolve(model=model.strip())
    except UnknownModel as exc:
        raise Invalid(f"model: {exc.message}", field="model") from exc


def prefix_remove(*, name: str) -> None:
    """Stop sending the prefix named ``name`` (nodes keep what they hold until it is
    displaced). Raises ``NotFound``."""
    with transaction.atomic():
        deleted, _ = SharedPrefix.objects.filter(name=name).delete()
        if not deleted:
            raise NotFound(f"no prefix is registered as {name!r}.")
        audit_record(action="prefix.remove", target=name)


@dataclass
class PrefixView:
    """A registered prefix as the page and the API show it: which nodes hold it (publish its
    agent) and which serving its model do not yet."""

    prefix: SharedPrefix
    held_by: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)


def prefixes_overview() -> list[PrefixView]:
    """Every registered prefix with the nodes that hold it and those still to be sent it."""
    nodes = _serving_nodes()
    views = []
    for prefix in SharedPrefix.objects.all():
        view = PrefixView(prefix)
        for node in nodes:
            if prefix.model and _model_of(node) != prefix.model:
                continue
            held = prefix.agent in _published(node)
            (view.held_by if held else view.waiting).append(node.node_id)
        views.append(view)
    return views


def _serving_nodes() -> list[Node]:
    """Phalanx nodes that take sessions (external servers keep no shelf)."""
    nodes = Node.objects.filter(kind=Node.Kind.PHALANX, package__isnull=False)
    return [n for n in nodes.select_related("package") if takes_sessions(n)]


def _model_of(node: Node) -> str | None:
    """The name clients ask ``node`` for (``model_names.client_name``)."""
    package = node.package
    return client_name(
        served_name=node.served_name,
        package_name=package.name if package else None,
        family=package.family if package else None,
    )


def _published(node: Node) -> set[str]:
    load = node.last_seen_load if isinstance(node.last_seen_load, dict) else {}
    prefixes = load.get("prefixes")
    return set(prefixes) if isinstance(prefixes, list) else set()


def prefixes_send_due() -> int:
    """Send each node that takes sessions the registered prefixes of its model it does not
    publish yet (a periodic of the control loop); returns how many were sent. A node that
    cannot be reached is tried again next time."""
    registered = list(SharedPrefix.objects.all())
    sent = 0
    for node in _serving_nodes() if registered else []:
        due = [
            p
            for p in registered
            if (not p.model or p.model == _model_of(node)) and p.agent not in _published(node)
        ]
        if due:
            sent += _send(node, due)
    return sent


def _send(node: Node, due: list[SharedPrefix]) -> int:
    openings = [{"messages": p.messages(), "tools": p.tools} for p in due]
    try:
        held = node_client.prefixes_hold(
            node.address, node_id=node.node_id, prefixes=openings, timeout=SEND_TIMEOUT_S
        )
    except (httpx.HTTPError, ValueError) as exc:
        log.warning("shared prefixes not sent", extra={"node_id": node.node_id, "error": str(exc)})
        return 0
    for prefix, result in zip(due, held, strict=True):
        log.info(
            "shared prefix sent",
            extra={
                "node_id": node.node_id,
                "prefix": prefix.name,
                "state": result.get("state"),
                "tokens": result.get("tokens"),
            },
        )
    return len(due)
