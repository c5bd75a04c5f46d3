"""Config as a file: apply a YAML description of the array to the inventory, export it back.

The shape (every section and key optional; a node needs ``id`` and ``address``)::

    server: {listen: 127.0.0.1:9391, routing_key_header: X-Session-Id}
    pool:
      nodes:
        - {id: node-01, address: 127.0.0.11:9391, weight: 10, affinity: true}
      health_check_interval_ms: 5000
      failover_strategy: stick_and_redirect
    inference:
      model_path: /opt/models/agent-q4_k_m.gguf
      ai_module: device0,device1
      context_window: 4096
      max_batch: 32

Where it goes: ``server.routing_key_header``, ``pool.health_check_interval_ms`` and
``pool.failover_strategy`` → ``inference.RoutingPolicy``; ``pool.nodes`` → ``nodes.Node`` (also
``cpu_set`` and ``threads``, optional); the rest → ``console.ArrayConfig``. ``model_path`` names
the package every listed node serves: the newest package with that ``gguf_path``, else the file
is registered as a package when it exists on this host, else nodes keep theirs (a warning).

Applying is idempotent (a second apply changes nothing and reports every node unchanged) and
``export_config(apply_config(parse_config(text)))`` gives the same document back. Nodes not in the
file are kept unless ``prune=True``. Every error is a ``ConfigError`` naming the line and field:
``line 5, pool.nodes[1].address: must be host:port, for example 127.0.0.1:9401``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from console.audit import audit_record
from console.live import live_node_changed, live_node_removed
from console.models import ArrayConfig
from inference.models import ModelPackage, RoutingPolicy
from nodes import services as node_services
from nodes.models import Node

_ADDRESS = re.compile(r"^[A-Za-z0-9.\-]+:\d{1,5}$|^\[[0-9A-Fa-f:.]+\]:\d{1,5}$")
_HEADER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9\-]{0,63}$")
_NODE_ID = re.compile(r"^[-a-zA-Z0-9_]{1,64}$")
_CPU_SET = re.compile(r"^$|^\d+(-\d+)?(,\d+(-\d+)?)*$")
MAX_BYTES = 1 << 20


class ConfigError(Exception):
    """A config file problem: ``line`` (1-based, None when unknown), ``field`` (dotted path)."""

    def __init__(self, message: str, *, line: int | None = None, field: str | None = None):
        self.message, self.line, self.field = message, line, field
        where = ", ".join(p for p in (f"line {line}" if line else "", field or "") if p)
        super().__init__(f"{where}: {message}" if where else message)


@dataclass(frozen=True)
class NodeSpec:
    node_id: str
    address: str
    weight: float | None = None
    affinity: bool | None = None
    cpu_set: str | None = None
    threads: int | None = None
    package: str | None = None  # "name:version"; else inference.model_path's, else unchanged
    max_sessions: int | None = None
    kv_budget_tokens: int | None = None


@dataclass(frozen=True)
class ArraySpec:
    """A parsed, valid config file; None means "not in the file: leave as it is"."""

    listen: str | None = None
    routing_key_header: str | None = None
    nodes: list[NodeSpec] | None = None
    health_check_interval_ms: int | None = None
    failover_strategy: str | None = None
    model_path: str | None = None
    ai_module: str | None = None
    context_window: int | None = None
    max_batch: int | None = None
    routing: dict[str, tuple[Any, int]] | None = None  # policy field -> (value, line)


@dataclass
class ApplyReport:
    """What an apply did (or would do with ``dry_run``): node ids by outcome, changed policy and
    array settings, and warnings."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    settings_changed: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)  # "field: before -> after", one a line
    warnings: list[str] = field(default_factory=list)
    dry_run: bool = False

    def note(self, where: str, before: Any, after: Any) -> None:
        self.changes.append(f"{where}: {_shown(before)} \u2192 {_shown(after)}")

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.removed or self.settings_changed)


def _shown(value: Any) -> str:
    if value is None or value == "":
        return "(none)"
    return str(_num(value)) if isinstance(value, float) else str(value)


# Policy fields the file writes elsewhere (server / pool), in the operators' own words.
POLICY_ELSEWHERE = {"session_header", "health_interval_s", "failover_strategy"}


def routing_fields() -> list[str]:
    """The routing policy's fields the ``routing`` section holds: every editable one but those
    in ``server`` and ``pool``."""
    return [
        f.name
        for f in RoutingPolicy._meta.concrete_fields
        if f.name not in ("id", "updated_at", *POLICY_ELSEWHERE)
    ]


# --- parsing --------------------------------------------------------------------------------


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _mapping(node: yaml.Node, path: str, keys: set[str]) -> dict[str, yaml.Node]:
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError("must be a mapping (key: value).", line=_line(node), field=path or None)
    out: dict[str, yaml.Node] = {}
    for key_node, value_node in node.value:
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
        where = f"{path}.{key}" if path else str(key)
        if key not in keys:
            allowed = ", ".join(sorted(keys))
            raise ConfigError(
                f"unknown key; expected one of {allowed}.", line=_line(key_node), field=where
            )
        if key in out:
            raise ConfigError("appears twice.", line=_line(key_node), field=where)
        out[key] = value_node
    return out


def _scalar(node: yaml.Node, path: str) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        raise ConfigError("must be a single value.", line=_line(node), field=path)
    return _construct(node)


def _construct(node: yaml.ScalarNode) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()


def _string(
    node: yaml.Node, path: str, pattern: re.Pattern[str] | None = None, hint: str = ""
) -> str:
    value = _scalar(node, path)
    if isinstance(value, bool) or value is None or isinstance(value, list | dict):
        raise ConfigError("must be text.", line=_line(node), field=path)
    text = str(value)
    if pattern is not None and not pattern.match(text):
        raise ConfigError(hint or "has the wrong shape.", line=_line(node), field=path)
    return text


def _int(node: yaml.Node, path: str, minimum: int) -> int:
    value = _scalar(node, path)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"must be a whole number >= {minimum}.", line=_line(node), field=path)
    return value


def _number(node: yaml.Node, path: str, minimum: float) -> float:
    value = _scalar(node, path)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise ConfigError(f"must be a number >= {minimum:g}.", line=_line(node), field=path)
    return float(value)


def _bool(node: yaml.Node, path: str) -> bool:
    value = _scalar(node, path)
    if not isinstance(value, bool):
        raise ConfigError("must be true or false.", line=_line(node), field=path)
    return value


def _node_spec(node: yaml.Node, path: str) -> NodeSpec:
    keys = _mapping(
        node,
        path,
        {
            "id",
            "address",
            "weight",
            "affinity",
            "cpu_set",
            "threads",
            "package",
            "max_sessions",
            "kv_budget_tokens",
        },
    )
    for required in ("id", "address"):
        if required not in keys:
            raise ConfigError(
                f"'{required}' is required.", line=_line(node), field=f"{path}.{required}"
            )
    return NodeSpec(
        node_id=_string(
            keys["id"], f"{path}.id", _NODE_ID, "must be letters, digits, '-' or '_' (at most 64)."
        ),
        address=_string(
            keys["address"],
            f"{path}.address",
            _ADDRESS,
            "must be host:port, for example 127.0.0.1:9401.",
        ),
        weight=_number(keys["weight"], f"{path}.weight", 0) if "weight" in keys else None,
        affinity=_bool(keys["affinity"], f"{path}.affinity") if "affinity" in keys else None,
        cpu_set=_string(
            keys["cpu_set"],
            f"{path}.cpu_set",
            _CPU_SET,
            "must be a CPU list such as 0, 0-3 or 0,2.",
        )
        if "cpu_set" in keys
        else None,
        threads=_int(keys["threads"], f"{path}.threads", 1) if "threads" in keys else None,
        package=_string(keys["package"], f"{path}.package") if "package" in keys else None,
        max_sessions=_int(keys["max_sessions"], f"{path}.max_sessions", 0)
        if "max_sessions" in keys
        else None,
        kv_budget_tokens=_int(keys["kv_budget_tokens"], f"{path}.kv_budget_tokens", 0)
        if "kv_budget_tokens" in keys
        else None,
    )


def _nodes(node: yaml.Node, path: str) -> list[NodeSpec]:
    if isinstance(node, yaml.ScalarNode) and node.value in ("", "~", "null"):
        return []
    if not isinstance(node, yaml.SequenceNode):
        raise ConfigError("must be a list of nodes.", line=_line(node), field=path)
    specs: list[NodeSpec] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(node.value):
        spec = _node_spec(item, f"{path}[{i}]")
        if spec.node_id in seen:
            raise ConfigError(
                f"node id {spec.node_id!r} is also at line {seen[spec.node_id]}.",
                line=_line(item),
                field=f"{path}[{i}].id",
            )
        seen[spec.node_id] = _line(item)
        specs.append(spec)
    return specs


def _routing(node: yaml.Node) -> dict[str, tuple[Any, int]]:
    """The ``routing`` section: policy fields as written (the model checks them on apply)."""
    keys = _mapping(node, "routing", set(routing_fields()))
    out: dict[str, tuple[Any, int]] = {}
    for name, value_node in keys.items():
        if name == "model_aliases":
            value = _plain(value_node, f"routing.{name}")
        else:
            value = _scalar(value_node, f"routing.{name}")
        out[name] = (value, _line(value_node))
    return out


def _plain(node: yaml.Node, path: str) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid here: {exc}", line=_line(node), field=path) from exc
    finally:
        loader.dispose()


def parse_config(text: str) -> ArraySpec:
    """Parse and check a config file's text. Raises ``ConfigError`` naming line and field."""
    if len(text.encode()) > MAX_BYTES:
        raise ConfigError(f"the file is larger than {MAX_BYTES} bytes.")
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise ConfigError(
            f"not valid YAML: {exc.problem or exc}", line=mark.line + 1 if mark else None
        ) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {exc}") from exc
    except RecursionError as exc:
        raise ConfigError("the YAML nests too deeply.") from exc
    if root is None:
        return ArraySpec()
    top = _mapping(root, "", {"server", "pool", "routing", "inference"})
    values: dict[str, Any] = {}
    if "server" in top:
        server = _mapping(top["server"], "server", {"listen", "routing_key_header"})
        if "listen" in server:
            values["listen"] = _string(
                server["listen"],
                "server.listen",
                _ADDRESS,
                "must be host:port, for example 127.0.0.1:9391.",
            )
        if "routing_key_header" in server:
            values["routing_key_header"] = _string(
                server["routing_key_header"],
                "server.routing_key_header",
                _HEADER,
                "must be an HTTP header name such as X-Session-Id.",
            )
    if "pool" in top:
        pool = _mapping(
            top["pool"], "pool", {"nodes", "health_check_interval_ms", "failover_strategy"}
        )
        if "nodes" in pool:
            values["nodes"] = _nodes(pool["nodes"], "pool.nodes")
        if "health_check_interval_ms" in pool:
            values["health_check_interval_ms"] = _int(
                pool["health_check_interval_ms"], "pool.health_check_interval_ms", 100
            )
        if "failover_strategy" in pool:
            choices = [c.value for c in RoutingPolicy.FailoverStrategy]
            value = _string(pool["failover_strategy"], "pool.failover_strategy")
            if value not in choices:
                raise ConfigError(
                    f"must be one of {', '.join(choices)}.",
                    line=_line(pool["failover_strategy"]),
                    field="pool.failover_strategy",
                )
            values["failover_strategy"] = value
    if "routing" in top:
        values["routing"] = _routing(top["routing"])
    if "inference" in top:
        inf = _mapping(
            top["inference"],
            "inference",
            {"model_path", "ai_module", "context_window", "max_batch"},
        )
        if "model_path" in inf:
            values["model_path"] = _string(inf["model_path"], "inference.model_path")
        if "ai_module" in inf:
            values["ai_module"] = _string(inf["ai_module"], "inference.ai_module")
        if "context_window" in inf:
            values["context_window"] = _int(inf["context_window"], "inference.context_window", 1)
        if "max_batch" in inf:
            values["max_batch"] = _int(inf["max_batch"], "inference.max_batch", 1)
    return ArraySpec(**values)


# --- applying -------------------------------------------------------------------------------


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
        return package_resolve(model=spec.package)
    except UnknownModel as exc:
        raise ConfigError(f"no package {spec.package!r}.", field=f"{spec.node_id}.package") from exc


def _apply_node(spec: NodeSpec, package: ModelPackage | None, report: ApplyReport) -> None:
    node = Node.objects.filter(node_id=spec.node_id).first()
    package = _node_package(spec, package)
    given = {
        "address": spec.address,
        "package_id": package.pk if package else None,
        "weight": spec.weight,
        "affinity": spec.affinity,
        "cpu_set": spec.cpu_set,
        "threads": spec.threads,
        "max_sessions": spec.max_sessions,
        "kv_budget_tokens": spec.kv_budget_tokens,
    }
    defaults = {"weight": 1.0, "affinity": True, "cpu_set": "", "threads": 1}
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
    )
    limits = {k: wanted[k] for k in ("max_sessions", "kv_budget_tokens")}
    if any(getattr(saved, k) != v for k, v in limits.items()):
        Node.objects.filter(pk=saved.pk).update(**limits)
    live_node_changed(node_id=spec.node_id, event=saved.events.first() if node is None else None)


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
        if report.changed and not dry_run:
            audit_record(action="config.apply", target="config file", changes=_audit_lines(report))
    return report


def _audit_lines(report: ApplyReport) -> list[str]:
    lines = [f"created: {n}" for n in report.created] + [f"removed: {n}" for n in report.removed]
    return lines + report.changes


def apply_config_text(text: str, *, prune: bool = False, dry_run: bool = False) -> ApplyReport:
    """``apply_config(parse_config(text))``. Raises ``ConfigError``."""
    return apply_config(parse_config(text), prune=prune, dry_run=dry_run)


# --- exporting ------------------------------------------------------------------------------


class _Flow(dict):
    """A mapping dumped in flow style: ``{id: node-01, address: ...}``."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(
    _Flow,
    lambda d, data: d.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=True),
)
_Dumper.add_representer(
    dict,
    lambda d, data: d.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=False),
)


def _num(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def export_document() -> dict[str, Any]:
    """The inventory and settings as the config file's mapping (key order as documented):
    every routing-policy field and every node setting, so applying it to another array, or to
    this one later, restores them all; applying it unchanged changes nothing."""
    policy = RoutingPolicy.load()
    config = ArrayConfig.load()
    server = _Flow()
    if config.listen:
        server["listen"] = config.listen
    server["routing_key_header"] = str(policy.session_header)
    nodes = [
        _node_entry(node) for node in Node.objects.select_related("package").order_by("node_id")
    ]
    pool: dict[str, Any] = {
        "nodes": nodes,
        "health_check_interval_ms": int(round(policy.health_interval_s * 1000)),
        "failover_strategy": str(policy.failover_strategy),
    }
    routing = {name: _plain_value(getattr(policy, name)) for name in routing_fields()}
    inference: dict[str, Any] = {}
    if config.model_path:
        inference["model_path"] = config.model_path
    if config.ai_modules:
        inference["ai_module"] = config.ai_modules
    if config.context_window:
        inference["context_window"] = config.context_window
    if config.max_batch:
        inference["max_batch"] = config.max_batch
    document: dict[str, Any] = {"server": server, "pool": pool, "routing": routing}
    if inference:
        document["inference"] = inference
    return document


def _node_entry(node: Node) -> _Flow:
    entry = _Flow(
        id=node.node_id,
        address=node.address,
        weight=_num(node.weight),
        affinity=node.affinity,
        cpu_set=node.cpu_set,
        threads=node.threads,
        max_sessions=node.max_sessions,
        kv_budget_tokens=node.kv_budget_tokens,
    )
    if node.package:
        entry["package"] = node.package.key
    return entry


def _plain_value(value: Any) -> Any:
    if isinstance(value, float):
        return _num(value)
    if isinstance(value, dict):
        return {str(k): _plain_value(v) for k, v in value.items()}
    return str(value) if hasattr(value, "value") else value


def export_config() -> str:
    """The inventory and settings as YAML text (apply it to get the same inventory back)."""
    return yaml.dump(
        export_document(),
        Dumper=_Dumper,
        sort_keys=False,
        width=100,
        default_flow_style=False,
        allow_unicode=True,
    )
