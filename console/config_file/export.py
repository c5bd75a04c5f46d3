"""Exporting the array as a config file (every policy field and node setting)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import yaml

from console.config_file.spec import _num, routing_fields
from console.models import ArrayConfig
from inference.models import RoutingPolicy
from inference.usage.quotas import quota_table
from nodes.models import Node


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
    document["quotas"] = _quotas()[0]
    return document


def _quotas() -> tuple[dict[str, Any], list[str]]:
    """The ``quotas`` section (every role's default, every limit; each token with a quota,
    not revoked, by name) and the names left out: those several tokens share, which the file
    cannot tell apart."""
    table = quota_table()
    active = [row for row in table["tokens"] if not row["revoked"]]
    shared = Counter(row["name"] for row in active)
    tokens: dict[str, Any] = {}
    left_out: set[str] = set()
    for row in active:
        if all(value is None for value in row["values"].values()):
            continue
        if shared[row["name"]] > 1:
            left_out.add(row["name"])
        else:
            tokens[row["name"]] = _Flow(row["values"])
    roles = {role: _Flow(values) for role, values in table["roles"].items()}
    return {"roles": roles, "tokens": tokens}, sorted(left_out)


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
    if node.kind != Node.Kind.PHALANX:
        entry["kind"] = node.kind
    if node.served_name:
        entry["served_name"] = node.served_name
    return entry


def _plain_value(value: Any) -> Any:
    if isinstance(value, float):
        return _num(value)
    if isinstance(value, dict):
        return {str(k): _plain_value(v) for k, v in value.items()}
    return str(value) if hasattr(value, "value") else value


def export_config() -> str:
    """The inventory and settings as YAML text (apply it to get the same inventory back)."""
    text = yaml.dump(
        export_document(),
        Dumper=_Dumper,
        sort_keys=False,
        width=100,
        default_flow_style=False,
        allow_unicode=True,
    )
    left_out = _quotas()[1]
    if left_out:
        text += (
            f"# quotas.tokens: not written for {', '.join(left_out)}: several tokens (not "
            "revoked) have that name; rename them to set their quotas here, or set them on the "
            "Tokens page.\n"
        )
    return text
