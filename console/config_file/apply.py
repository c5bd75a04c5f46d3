"""Applying a config file: make the inventory and settings match it, in one transaction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from console.config_file.parse import parse_config
from console.config_file.spec import ApplyReport, ArraySpec, ConfigError, NodeSpec, QuotaSpec
from console.lib.audit import audit_record
from console.lib.errors import ConsoleError
from console.models import ArrayConfig
from inference.models import ModelPackage, RoutingPolicy
from inference.usage.quotas import quota_set, quota_token_named, quota_values
from nodes import services as node_services
from nodes.live import live_node_changed, live_node_removed
from nodes.models import Node


def _package_for(model_path: str, report: ApplyReport) -> ModelPackage | None:
    package = ModelPackage.objects.filter(gguf_path=model_path).order_by("-created_at").first()
    if package is not None or report.dry_run:
        return package
    path = Path(model_path)
    if path.is_file():
        from console.services import package_register_file
        from inference.bundled import file_sha256

        version = file_sha256(path)[:12]
        name = slugify(path.stem.lower())[:128] or "model"
        return package_register_file(name=name, version=version, gguf_path=model_path)[0]
    report.warnings.append(
        f"inference.model_path: no package has {model_path} and the file is not on this host; "
        "nodes keep the package they serve."
    )
    return None


def _policy_changes(spec: ArraySpec) -> dict[str, tuple[Any, int | None]]:
    """``{policy field: (value, line)}`` the file sets (``server``, ``pool``, ``routing``)."""
    changes: dict[str, tuple[Any, int | None]] = dict(spec.routing or {})
    if spec.routing_key_header is not None:
        changes["session_header"] = (spec.routing_key_header, None)
    if spec.health_check_interval_ms is not None:
        changes["health_interval_s"] = (spec.health_check_interval_ms / 1000.0, None)
    if spec.failover_strategy is not None:
        changes["failover_strategy"] = (spec.failover_strategy, None)
    return changes


def _apply_policy(spec: ArraySpec, report: ApplyReport) -> None:
    """Check every policy value the file sets with the model's own rules (``full_clean``:
    types, bounds, cross-field), note each change, and save unless a dry run."""
    policy = RoutingPolicy.load()
    changed = []
    for name, (value, _) in _policy_changes(spec).items():
        before = getattr(policy, name)
        if before != value:
            setattr(policy, name, value)
            changed.append(name)
            report.note(_policy_path(name), before, value)
    if not changed:
        return
    try:
        policy.full_clean()
    except ValidationError as exc:
        name, messages = next(iter(exc.message_dict.items()))
        line = dict(_policy_changes(spec)).get(name, (None, None))[1]
        raise ConfigError(" ".join(messages), line=line, field=_policy_path(name)) from exc
    report.settings_changed += changed
    if not report.dry_run:
        policy.save()


def _policy_path(name: str) -> str:
    elsewhere = {
        "session_header": "server.routing_key_header",
        "health_interval_s": "pool.health_check_interval_ms",
        "failover_strategy": "pool.failover_strategy",
    }
    return elsewhere.get(name, f"routing.{name}")


def _apply_settings(spec: ArraySpec, report: ApplyReport) -> None:
    _apply_policy(spec, report)
    config = ArrayConfig.load()
    config_changes = {
        "listen": spec.listen,
        "model_path": spec.model_path,
        "ai_modules": spec.ai_module,
        "context_window": spec.context_window,
        "max_batch": spec.max_batch,
    }
    config_changed = [
        k for k, v in config_changes.items() if v is not None and getattr(config, k) != v
    ]
    for key in config_changed:
        report.note(key, getattr(config, key), config_changes[key])
    report.settings_changed += config_changed
    if report.dry_run:
        return
    for key in config_changed:
        setattr(config, key, config_changes[key])
    config.applied_at = timezone.now()
    config.save()


def _node_package(spec: NodeSpec, package: ModelPackage | None) -> ModelPackage | None:
    """The package a node entry names (``name:version``), else ``inference.model_path``'s."""
    if spec.package is None:
        return package
    from inference.errors import UnknownModel
    from inference.services import package_resolve

    try:
        found = package_resolve(model=spec.package)
    except UnknownModel as exc:
        raise ConfigError(f"no package {spec.package!r}.", field=f"{spec.node_id}.package") from exc
    if found.kind == ModelPackage.Kind.EMBEDDING:
        raise ConfigError(
            f"{found.key} is an embedding model (run by the control plane); a node serves a "
            "chat package.",
            line=spec.line,
            field=f"{spec.node_id}.package",
        )
    return found


def _node_kind(spec: NodeSpec, node: Node | None) -> str:
    """The node's kind after the entry (given, else as it is, else a Phalanx node); raises
    ``ConfigError`` for an external node without the model name it serves."""
    kind = spec.kind or (node.kind if node else Node.Kind.PHALANX)
    if kind == Node.Kind.EXTERNAL and not (spec.served_name or (node and node.served_name)):
        raise ConfigError(
            "is required for an external node (the model name it serves).",
            line=spec.line,
            field=f"{spec.where}.served_name",
        )
    return kind


def _apply_node(spec: NodeSpec, package: ModelPackage | None, report: ApplyReport) -> None:
    node = Node.objects.filter(node_id=spec.node_id).first()
    if node is None and spec.address is None:
        raise ConfigError(
            "is required for a new node.", line=spec.line, field=f"{spec.where}.address"
        )
    kind = _node_kind(spec, node)
    package = _node_package(spec, package) if kind != Node.Kind.EXTERNAL else None
    given = {
        "kind": kind,
        "served_name": spec.served_name,
        "address": spec.address,
        "package_id": package.pk if package else None,
        "weight": spec.weight,
        "affinity": spec.affinity,
        "cpu_set": spec.cpu_set,
        "threads": spec.threads,
        "max_sessions": spec.max_sessions,
        "kv_budget_tokens": spec.kv_budget_tokens,
    }
    defaults = {"weight": 1.0, "affinity": True, "cpu_set": "", "threads": 1, "served_name": ""}
    defaults |= {"max_sessions": 0, "kv_budget_tokens": 0, "package_id": None}
    wanted = {
        k: v if v is not None else (getattr(node, k) if node else defaults.get(k))
        for k, v in given.items()
    }
    diffs = {k: (getattr(node, k), v) for k, v in wanted.items() if node and getattr(node, k) != v}
    if node is not None and not diffs:
        report.unchanged.append(spec.node_id)
        return
    (report.created if node is None else report.updated).append(spec.node_id)
    for key, (before, after) in diffs.items():
        report.note(f"{spec.node_id}.{key}", before, after)
    if report.dry_run:
        return
    saved, _ = node_services.node_upsert(
        node_id=spec.node_id,
        address=wanted["address"],
        package_id=wanted["package_id"],
        cpu_set=wanted["cpu_set"],
        threads=wanted["threads"],
        weight=wanted["weight"],
        affinity=wanted["affinity"],
        kind=wanted["kind"],
        served_name=wanted["served_name"],
    )
    limits = {k: wanted[k] for k in ("max_sessions", "kv_budget_tokens")}
    if any(getattr(saved, k) != v for k, v in limits.items()):
        Node.objects.filter(pk=saved.pk).update(**limits)
    live_node_changed(node_id=spec.node_id, event=saved.events.first() if node is None else None)


def _quota_target(spec: QuotaSpec) -> dict[str, Any]:
    """``quota_set``'s target for an entry: the role, or the one token (not revoked) with the
    entry's name; ``ConfigError`` naming the entry when there is none or several."""
    if spec.kind == "roles":
        return {"role": spec.name}
    try:
        return {"token_id": quota_token_named(name=spec.name)}
    except ConsoleError as exc:
        raise ConfigError(exc.message, line=spec.line, field=spec.where) from exc


def _apply_quotas(specs: list[QuotaSpec], report: ApplyReport) -> None:
    """Set the limits each entry gives that differ from what is stored (``quota_set``,
    audited as ``quota.set``); a limit the entry leaves out stays as it is."""
    for spec in specs:
        target = _quota_target(spec)
        stored = quota_values(**target)
        changed = {k: v for k, v in spec.values.items() if stored.get(k) != v}
        if not changed:
            continue
        for name, value in changed.items():
            report.note(f"{spec.where}.{name}", stored.get(name), value)
        report.settings_changed.append(spec.where)
        if not report.dry_run:
            quota_set(changes=changed, **target)


def apply_config(spec: ArraySpec, *, prune: bool = False, dry_run: bool = False) -> ApplyReport:
    """Make the inventory and settings match ``spec`` in one transaction; returns what changed
    (with ``dry_run``, what would change, and nothing is written)."""
    report = ApplyReport(dry_run=dry_run)
    with transaction.atomic():
        package = _package_for(spec.model_path, report) if spec.model_path else None
        _apply_settings(spec, report)
        if spec.nodes is not None:
            for node_spec in spec.nodes:
                _apply_node(node_spec, package, report)
            if prune:
                listed = {n.node_id for n in spec.nodes}
                for node in Node.objects.exclude(node_id__in=listed):
                    report.removed.append(node.node_id)
                    if not dry_run:
                        node.delete()
                        live_node_removed(node_id=node.node_id)
        if spec.quotas is not None:
            _apply_quotas(spec.quotas, report)
        if report.changed and not dry_run:
            audit_record(action="config.apply", target="config file", changes=_audit_lines(report))
    return report


def _audit_lines(report: ApplyReport) -> list[str]:
    lines = [f"created: {n}" for n in report.created] + [f"removed: {n}" for n in report.removed]
    return lines + report.changes


def apply_config_text(text: str, *, prune: bool = False, dry_run: bool = False) -> ApplyReport:
    """``apply_config(parse_config(text))``. Raises ``ConfigError``."""
    return apply_config(parse_config(text), prune=prune, dry_run=dry_run)
