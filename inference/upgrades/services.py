"""Starting and steering rolling upgrades (``inference.Upgrade``); the control loop drives them
(``inference.upgrades.driver``). Every action is audited (``console.lib.audit``).

Errors (``console.lib.errors``): ``Invalid`` (a field, 422), ``NotFound``, ``Conflict`` (a package
that may not be deployed, an upgrade of the model already under way, an action the upgrade's
state does not allow: 409).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from console.lib.audit import audit_record, current_actor
from console.lib.compiled_sql import CompiledQuery
from console.lib.errors import Conflict, Invalid, NotFound
from inference.models import ModelPackage, SessionRoute, Upgrade, UpgradeEvent
from inference.routing import Rollout
from inference.upgrades import plan
from nodes.models import Node

State, Step = Upgrade.State, Upgrade.Step
ACTIVE = (State.PENDING, State.RUNNING, State.PAUSED, State.ROLLING_BACK)


def upgrade_get(upgrade_id: int) -> Upgrade:
    upgrade = Upgrade.objects.select_related("from_package", "to_package").filter(pk=upgrade_id)
    found = upgrade.first()
    if found is None:
        raise NotFound(f"No upgrade {upgrade_id}.", code="upgrade_not_found")
    return found


def upgrade_event(upgrade: Upgrade, kind: str, message: str, node_id: str = "") -> UpgradeEvent:
    """One line of the upgrade's event log."""
    return UpgradeEvent.objects.create(
        upgrade=upgrade, kind=kind, message=message[:2000], node_id=node_id
    )


def nodes_serving(package: ModelPackage, model: str) -> list[Node]:
    """The nodes that serve ``package`` to clients asking for ``model``."""
    nodes = Node.objects.filter(package=package).select_related("package")
    return [n for n in nodes if n.model_name == model]


@transaction.atomic
def upgrade_start(
    *,
    from_package_id: int,
    to_package_id: int,
    model: str | None = None,
    settings: dict[str, Any] | None = None,
    node_settings: dict[str, int] | None = None,
) -> Upgrade:
    """Plan an upgrade of the nodes serving ``from_package`` (as ``model``, the name clients
    ask for; default: the name they serve now) to ``to_package``; the control loop starts it
    at its next tick. ``node_settings`` (threads, sequences, ctx_per_seq, host_ram_mib) roll
    with it; with them, ``to_package`` may be ``from_package`` (a settings-only roll). Raises
    ``NotFound``; ``Conflict`` when ``to_package`` is not approved (only approved versions are
    deployed), when it is the same version and no setting changes, when no node serves
    ``from_package``, or when an upgrade of ``model`` is under way; ``Invalid`` for a bad
    setting (``plan.LIMITS``) or node setting (``plan.NODE_SETTING_LIMITS``, ``ctx_per_seq``
    at most ``to_package``'s trained context)."""
    from inference.packages.services import package_get

    old, new = package_get(from_package_id), package_get(to_package_id)
    node_settings = _checked_node_settings(node_settings, new)
    _check_rollable(old, new, node_settings)
    chosen = _chosen_settings(settings)
    model, nodes = _nodes_to_upgrade(old, model)
    if Upgrade.objects.select_for_update().filter(model=model, state__in=ACTIVE).exists():
        raise Conflict(f"An upgrade of {model!r} is under way.", code="upgrade_exists")
    upgrade = Upgrade.objects.create(
        model=model,
        from_package=old,
        to_package=new,
        settings=chosen,
        node_settings=node_settings,
        nodes=_plan_steps(nodes, int(chosen["max_unavailable"])),
        created_by=current_actor()[:150],
    )
    upgrade_event(upgrade, "planned", _plan_sentence(upgrade))
    audit_record(
        action="upgrade.start",
        target=f"upgrade {upgrade.pk}",
        changes=[f"{model}: {old.key} \u2192 {new.key}"]
        + [f"{k}: {_shown(v)}" for k, v in chosen.items() if v != plan.DEFAULTS[k]],
    )
    return upgrade


def _check_rollable(old: ModelPackage, new: ModelPackage, node_settings: dict[str, int]) -> None:
    """Raises ``Conflict`` unless ``new`` may replace ``old``: another version (or the same
    with new ``node_settings``), approved, with a chat template; ``Invalid`` when ``new`` is an
    embedding package (nodes serve chat models only)."""
    from inference.packages.services import package_check_chat

    package_check_chat(new, doing="an upgrade of nodes", field="to_package_id")
    if old.pk == new.pk and not node_settings:
        raise Conflict(
            f"{old.key} is already what those nodes serve (give node_settings to roll new "
            "settings).",
            code="same_package",
        )
    if new.status != ModelPackage.Status.APPROVED:
        raise Conflict(
            f"{new.key} is {new.status}; only an approved version can be rolled out "
            "(approve it, with an override reason if its gate has not passed).",
            code="package_not_approved",
            field="to_package_id",
        )
    if new.completion_only:
        raise Conflict(
            f"{new.key} is completion-only (no chat template); chat clients would lose the array.",
            code="package_completion_only",
            field="to_package_id",
        )


def _chosen_settings(given: dict[str, Any] | None) -> dict[str, Any]:
    """``plan.settings_with_defaults``; raises ``Invalid`` naming ``settings.<key>``."""
    try:
        return plan.settings_with_defaults(given)
    except plan.BadSettings as exc:
        raise Invalid(f"settings.{exc}", field=f"settings.{exc.field}") from exc


def _nodes_to_upgrade(old: ModelPackage, model: str | None) -> tuple[str, list[Node]]:
    """``(model, nodes)``: the name clients ask for (given, else the one the nodes of ``old``
    serve now, else ``old``'s name) and the nodes serving ``old`` as it. Raises ``Conflict``
    when there is none or one of them is down."""
    served = Node.objects.filter(package=old).select_related("package")
    model = (model or "").strip() or next((n.model_name for n in served), old.name)
    nodes = nodes_serving(old, model)
    if not nodes:
        raise Conflict(f"No node serves {old.key} as {model!r}.", code="no_nodes")
    down = [n.node_id for n in nodes if n.state == Node.State.DOWN]
    if down:
        raise Conflict(
            f"{', '.join(down)} {'is' if len(down) == 1 else 'are'} down: bring "
            f"{'it' if len(down) == 1 else 'them'} back or remove {'it' if len(down) == 1 else 'them'} "
            "before upgrading.",
            code="node_down",
        )
    return model, nodes


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else f"{value:g}"


def _plan_steps(nodes: list[Node], max_unavailable: int) -> list[dict[str, Any]]:
    """The plan's node steps: standby nodes first as a surge, then the serving ones emptiest
    first in batches (``plan.plan_batches``), each ``waiting``."""
    pinned = _pinned_counts([n.pk for n in nodes])
    drained = {n.node_id for n in nodes if n.state == Node.State.DRAINING}
    standby = {n.node_id for n in nodes if n.weight == 0}
    batches = plan.plan_batches(
        {n.node_id: pinned.get(n.pk, 0) for n in nodes}, standby, max_unavailable
    )
    steps = [
        {
            "node_id": node_id,
            "batch": number,
            "state": Step.WAITING,
            "since": timezone.now().isoformat(),
            "detail": "",
            "was_draining": node_id in drained,
            "surge": surge,
        }
        for number, (batch, surge) in enumerate(batches)
        for node_id in batch
    ]
    return steps


def _checked_node_settings(given: dict[str, Any] | None, package: ModelPackage) -> dict[str, int]:
    """``plan.node_settings_checked`` against ``package``'s trained context; raises
    ``Invalid`` naming ``node_settings.<key>``."""
    try:
        return plan.node_settings_checked(given, context_window=package.context_window)
    except plan.BadSettings as exc:
        raise Invalid(f"node_settings.{exc}", field=f"node_settings.{exc.field}") from exc


def _pinned_counts(node_pks: list[int]) -> dict[int, int]:
    rows = (
        SessionRoute.objects.filter(node_id__in=node_pks)
        .values("node_id")
        .annotate(count=Count("id", filter=Q(node__isnull=False)))
    )
    return {row["node_id"]: row["count"] for row in rows}


def _plan_sentence(upgrade: Upgrade) -> str:
    batches: dict[int, list[str]] = {}
    for step in upgrade.nodes:
        batches.setdefault(step["batch"], []).append(step["node_id"])
    surged = {s["batch"] for s in upgrade.nodes if s.get("surge")}
    parts = "; ".join(
        f"batch {b + 1}{' (surge: standby nodes)' if b in surged else ''}: {', '.join(ids)}"
        for b, ids in sorted(batches.items())
    )
    s = upgrade.settings
    settings = "".join(f", {k} {v}" for k, v in upgrade.node_settings.items())
    return (
        f"{upgrade.model}: {upgrade.from_package.key} \u2192 {upgrade.to_package.key}"
        f"{settings}; {parts}; canary {s['canary_share']:.0%} of new sessions, bake "
        f"{s['bake_s']:g} s per batch; a bake that compares nothing: "
        f"{s.get('no_traffic', plan.DEFAULTS['no_traffic'])}"
    )


def _act(upgrade_id: int, action: str, allowed: tuple[str, ...]) -> Upgrade:
    upgrade = Upgrade.objects.select_for_update().filter(pk=upgrade_id).first()
    if upgrade is None:
        raise NotFound(f"No upgrade {upgrade_id}.", code="upgrade_not_found")
    if upgrade.state not in allowed:
        raise Conflict(
            f"Upgrade {upgrade_id} is {upgrade.state}; it cannot {action} now.",
            code="upgrade_state",
        )
    return upgrade


@transaction.atomic
def upgrade_pause(*, upgrade_id: int) -> Upgrade:
    """Hold the upgrade where it is (a node mid-switch finishes its step first). Raises
    ``Conflict`` unless it is pending or running."""
    upgrade = _act(upgrade_id, "pause", (State.PENDING, State.RUNNING))
    upgrade.paused_from, upgrade.state = upgrade.state, State.PAUSED
    upgrade.save(update_fields=["paused_from", "state"])
    return _audited(upgrade, "pause", f"paused by {current_actor()}")


@transaction.atomic
def upgrade_resume(*, upgrade_id: int) -> Upgrade:
    """Go on from where it was paused. Raises ``Conflict`` unless paused."""
    upgrade = _act(upgrade_id, "resume", (State.PAUSED,))
    upgrade.state, upgrade.paused_from = upgrade.paused_from or State.RUNNING, ""
    upgrade.save(update_fields=["paused_from", "state"])
    return _audited(upgrade, "resume", f"resumed by {current_actor()}")


@transaction.atomic
def upgrade_promote(*, upgrade_id: int) -> Upgrade:
    """Skip the remaining bake times and canary: every new session goes to the new version and
    the remaining batches follow one another as soon as their nodes pass their checks. Raises
    ``Conflict`` unless pending, running or paused."""
    upgrade = _act(upgrade_id, "be promoted", (State.PENDING, State.RUNNING, State.PAUSED))
    upgrade.promote = True
    upgrade.save(update_fields=["promote"])
    return _audited(upgrade, "promote", f"promoted by {current_actor()}: no more bake time")


@transaction.atomic
def upgrade_abort(*, upgrade_id: int, reason: str = "") -> Upgrade:
    """Roll back now: nodes already on the new version go back to the old one, drained first.
    Raises ``Conflict`` once the upgrade has finished or is rolling back."""
    upgrade = _act(upgrade_id, "abort", (State.PENDING, State.RUNNING, State.PAUSED))
    why = f"aborted by {current_actor()}{': ' + reason.strip() if reason.strip() else ''}"
    upgrade.state, upgrade.reason, upgrade.new_share = State.ROLLING_BACK, why, 0.0
    upgrade.save(update_fields=["state", "reason", "new_share"])
    return _audited(upgrade, "abort", why)


def _audited(upgrade: Upgrade, action: str, message: str) -> Upgrade:
    upgrade_event(upgrade, action, message)
    audit_record(action=f"upgrade.{action}", target=f"upgrade {upgrade.pk}", changes=[message])
    return upgrade


ROLLING = (State.RUNNING, State.PAUSED, State.ROLLING_BACK)  # upgrades that split new sessions

_rollout_rows = CompiledQuery(
    lambda *states: Upgrade.objects.filter(state__in=states).values_list(
        "model", "from_package_id", "to_package_id", "new_share"
    )
)


def active_rollouts() -> dict[str, Rollout]:
    """``{model: Rollout}`` of the upgrades under way, for routing new sessions. Read on the
    proxy's hot path for every turn of a session, so its SQL is compiled once (about 0.1 ms)."""
    rows = _rollout_rows.rows(*(str(state) for state in ROLLING))
    return {model: Rollout(old, new, share) for model, old, new, share in rows}
