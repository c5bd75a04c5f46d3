"""Reads for the proxy and the admin API: packages served right now, the routing table."""

from __future__ import annotations

from dataclasses import dataclass, field

from inference.model_names import client_name, package_key
from inference.models import ModelPackage, SessionRoute
from nodes.models import Node
from nodes.selectors import takes_sessions


@dataclass
class ServedVersion:
    """One package version under a client-facing name: ``package`` ``name:version``, ``up``
    nodes taking traffic on it, ``nodes`` in all."""

    package: str
    package_id: int
    up: int = 0
    nodes: int = 0


@dataclass
class ServedModel:
    """A name clients ask for (a family, ``inference.model_names``): ``up`` nodes taking
    traffic, its ``versions`` (newest first), ``created`` (s, its newest version's) and
    ``sequence_limit`` (tokens a sequence holds on its up nodes, the fewest; None until
    reported)."""

    name: str
    up: int = 0
    created: int = 0
    sequence_limit: int | None = None
    versions: list[ServedVersion] = field(default_factory=list)

    @property
    def serving(self) -> str:
        """The versions taking traffic, as a person reads them: ``"m-q4_k_m:1 on 2"``."""
        return ", ".join(f"{v.package} on {v.up}" for v in self.versions if v.up)


def served_models() -> list[ServedModel]:
    """Every client-facing name some node is served under, by name, with its versions and
    up counts (``nodes.selectors.takes_sessions``, routing's rule). One read of the nodes with their packages."""
    models: dict[str, ServedModel] = {}
    versions: dict[tuple[str, int], ServedVersion] = {}
    nodes = Node.objects.filter(package__isnull=False).select_related("package")
    for node in sorted(nodes, key=lambda n: -n.package.created_at.timestamp()):
        package = node.package
        name = client_name(
            served_name=node.served_name, package_name=package.name, family=package.family
        )
        model = models.setdefault(
            name, ServedModel(name, created=int(package.created_at.timestamp()))
        )
        version = versions.get((name, package.pk))
        if version is None:
            version = versions[(name, package.pk)] = ServedVersion(
                package_key(package.name, package.version) or "", package.pk
            )
            model.versions.append(version)
        version.nodes += 1
        if takes_sessions(node):
            version.up += 1
            model.up += 1
            model.sequence_limit = _fewest(model.sequence_limit, node.last_seen_load)
    return [models[name] for name in sorted(models)]


def _fewest(limit: int | None, load: object) -> int | None:
    """``limit`` or the node's tokens a sequence (KV capacity over sequences), the fewer."""
    capacity = load.get("kv_capacity") if isinstance(load, dict) else None
    total = load.get("total") if isinstance(load, dict) else None
    if not (capacity and total):
        return limit
    mine = int(capacity // total)
    return mine if limit is None else min(limit, mine)


def packages_served() -> list[tuple[str, ModelPackage]]:
    """``(name clients ask for, package)`` for each model served by at least one ``up`` node
    that may take traffic (device validation passed, warned or waived)
    (its served name: the name stays while upgrades change the version under it), the newest
    version of each name first."""
    nodes = Node.objects.filter(
        state=Node.State.UP,
        package__isnull=False,
        validation__in=Node.ROUTABLE_VALIDATIONS,
    ).select_related("package")
    pairs = sorted(
        ((n.model_name, n.package) for n in nodes),
        key=lambda pair: (pair[0], -pair[1].created_at.timestamp()),
    )
    return [pair for pair in pairs if pair[0]]


def served_name(package: ModelPackage) -> str:
    """The name clients ask for ``package`` by: the served name of a node serving it, else
    its own name."""
    named = (
        Node.objects.filter(package=package)
        .exclude(served_name="")
        .values_list("served_name", flat=True)
        .first()
    )
    return named or package.name


def package_default() -> ModelPackage | None:
    """The package a websocket session uses when the client names none: the one served by the
    most ``up`` nodes, else the newest package."""
    from django.db.models import Count, Q

    return (
        ModelPackage.objects.annotate(
            up=Count(
                "nodes",
                filter=Q(
                    nodes__state=Node.State.UP,
                    nodes__validation__in=Node.ROUTABLE_VALIDATIONS,
                ),
            )
        )
        .order_by("-up", "-created_at", "-id")
        .first()
    )


def session_routes(
    *, node_id: str | None = None, limit: int = 100, offset: int = 0
) -> tuple[int, list[SessionRoute]]:
    """``(count, routes)`` of the routing table, most recently seen first, optionally only the
    sessions pinned to ``node_id``."""
    routes = SessionRoute.objects.select_related("node", "package").order_by("-last_seen_at")
    if node_id:
        routes = routes.filter(node__node_id=node_id)
    return routes.count(), list(routes[offset : offset + limit])


def session_route(*, session_id: str) -> SessionRoute | None:
    """One route with its node, package and decisions, or None."""
    return (
        SessionRoute.objects.select_related("node", "package")
        .prefetch_related("decisions")
        .filter(session_id=session_id)
        .first()
    )
