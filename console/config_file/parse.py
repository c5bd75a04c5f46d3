"""Parsing a config file: YAML to an ``ArraySpec``, every error naming its line and field."""

from __future__ import annotations

import re
from typing import Any

import yaml

from console.config_file.spec import (
    _ADDRESS,
    _CPU_SET,
    _HEADER,
    _KIND,
    _NODE_ID,
    _SERVED_NAME,
    MAX_BYTES,
    ArraySpec,
    ConfigError,
    NodeSpec,
    QuotaSpec,
    routing_fields,
)
from console.lib.errors import Invalid
from console.models import Role
from inference.models import Quota, RoutingPolicy
from inference.usage.quotas import quota_check


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _mapping(node: yaml.Node, path: str, keys: set[str]) -> dict[str, yaml.Node]:
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError("must be a mapping (key: value).", line=_line(node), field=path or None)
    out: dict[str, yaml.Node] = {}
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            raise ConfigError("keys must be plain names.", line=_line(key_node), field=path or None)
        key = key_node.value
        where = f"{path}.{key}" if path else key
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
    return _construct(node, path)


def _construct(node: yaml.ScalarNode, path: str = "") -> Any:
    """The node's value by YAML's safe rules; ``ConfigError`` naming its line and ``path``
    when its tag cannot build it (``!!int 'abc'``, ``!!timestamp x``, an unsafe tag)."""
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    except Exception as exc:  # yaml.YAMLError, ValueError, and AttributeError (!!timestamp x)
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(
            f"{node.tag} {node.value!r} is not a value: {why}", line=_line(node), field=path or None
        ) from None
    finally:
        loader.dispose()


def _string(node: yaml.Node, path: str, shape: tuple[re.Pattern[str], str] | None = None) -> str:
    """A scalar as text; ``shape`` is a pattern it must match and the sentence saying so."""
    value = _scalar(node, path)
    if isinstance(value, bool) or value is None or isinstance(value, list | dict):
        raise ConfigError("must be text.", line=_line(node), field=path)
    text = str(value)
    if shape is not None and not shape[0].fullmatch(text):
        raise ConfigError(shape[1], line=_line(node), field=path)
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
            "kind",
            "served_name",
        },
    )
    for required in ("id",):  # an existing node's address may be left as it is
        if required not in keys:
            raise ConfigError(
                f"'{required}' is required.", line=_line(node), field=f"{path}.{required}"
            )
    return NodeSpec(
        node_id=_string(
            keys["id"],
            f"{path}.id",
            (_NODE_ID, "must be letters, digits, '-' or '_' (at most 64)."),
        ),
        address=_string(
            keys["address"],
            f"{path}.address",
            (_ADDRESS, "must be host:port, for example 127.0.0.1:9401."),
        )
        if "address" in keys
        else None,
        where=path,
        line=_line(node),
        **_node_settings(keys, path),
    )


def _node_settings(keys: dict[str, yaml.Node], path: str) -> dict[str, Any]:
    """A node entry's optional settings (None: not in the file, leave as it is)."""
    return dict(
        weight=_number(keys["weight"], f"{path}.weight", 0) if "weight" in keys else None,
        affinity=_bool(keys["affinity"], f"{path}.affinity") if "affinity" in keys else None,
        cpu_set=_string(
            keys["cpu_set"],
            f"{path}.cpu_set",
            (_CPU_SET, "must be a CPU list such as 0, 0-3 or 0,2."),
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
        kind=_string(keys["kind"], f"{path}.kind", (_KIND, "must be phalanx or external."))
        if "kind" in keys
        else None,
        served_name=_string(
            keys["served_name"],
            f"{path}.served_name",
            (_SERVED_NAME, "must be a model name of 1 to 128 characters, no spaces."),
        )
        if "served_name" in keys
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
    root = _compose(text)
    if root is None:
        return ArraySpec()
    top = _mapping(root, "", {"server", "pool", "routing", "inference", "quotas"})
    values: dict[str, Any] = {}
    if "server" in top:
        values |= _server(top["server"])
    if "pool" in top:
        values |= _pool(top["pool"])
    if "routing" in top:
        values["routing"] = _routing(top["routing"])
    if "inference" in top:
        values |= _inference(top["inference"])
    if "quotas" in top:
        values["quotas"] = _quotas(top["quotas"])
    return ArraySpec(**values)


def _compose(text: str) -> yaml.Node | None:
    if len(text.encode()) > MAX_BYTES:
        raise ConfigError(f"the file is larger than {MAX_BYTES} bytes.")
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise ConfigError(
            f"not valid YAML: {exc.problem or exc}", line=mark.line + 1 if mark else None
        ) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {exc}") from exc
    except RecursionError as exc:
        raise ConfigError("the YAML nests too deeply.") from exc


def _server(node: yaml.Node) -> dict[str, Any]:
    server = _mapping(node, "server", {"listen", "routing_key_header"})
    values: dict[str, Any] = {}
    if "listen" in server:
        values["listen"] = _string(
            server["listen"],
            "server.listen",
            (_ADDRESS, "must be host:port, for example 127.0.0.1:9391."),
        )
    if "routing_key_header" in server:
        values["routing_key_header"] = _string(
            server["routing_key_header"],
            "server.routing_key_header",
            (_HEADER, "must be an HTTP header name such as X-Session-Id."),
        )
    return values


def _pool(node: yaml.Node) -> dict[str, Any]:
    pool = _mapping(node, "pool", {"nodes", "health_check_interval_ms", "failover_strategy"})
    values: dict[str, Any] = {}
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
    return values


def _inference(node: yaml.Node) -> dict[str, Any]:
    inf = _mapping(node, "inference", {"model_path", "ai_module", "context_window", "max_batch"})
    values: dict[str, Any] = {}
    for key in ("model_path", "ai_module"):
        if key in inf:
            values[key] = _string(inf[key], f"inference.{key}")
    for key in ("context_window", "max_batch"):
        if key in inf:
            values[key] = _int(inf[key], f"inference.{key}", 1)
    return values


def _entries(node: yaml.Node, path: str, names: set[str] | None) -> dict[str, yaml.Node]:
    """A mapping by name (``names`` the allowed ones, None: any); empty when null."""
    if isinstance(node, yaml.ScalarNode) and _construct(node) is None:
        return {}
    if names is None and isinstance(node, yaml.MappingNode):
        names = {k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)}
    return _mapping(node, path, names or set())


def _quotas(node: yaml.Node) -> list[QuotaSpec]:
    """The ``quotas`` section: ``roles`` (each role's default) and ``tokens`` (by name), each
    ``{limit: whole number, or null for blank}``."""
    section = _entries(node, "quotas", {"roles", "tokens"})
    specs: list[QuotaSpec] = []
    for kind, names in (("roles", set(Role.values)), ("tokens", None)):
        if kind in section:
            for name, entry in _entries(section[kind], f"quotas.{kind}", names).items():
                specs.append(_quota(entry, kind, name))
    return specs


def _quota(node: yaml.Node, kind: str, name: str) -> QuotaSpec:
    path = f"quotas.{kind}.{name}"
    values: dict[str, int | None] = {}
    lines: dict[str, int] = {}
    for limit, value_node in _entries(node, path, set(Quota.LIMITS)).items():
        value = _scalar(value_node, f"{path}.{limit}")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(
                "must be a whole number, or null for blank.",
                line=_line(value_node),
                field=f"{path}.{limit}",
            )
        try:
            values |= quota_check({limit: value})
        except Invalid as exc:
            message = exc.message.removeprefix(f"{limit}: ")
            raise ConfigError(message, line=_line(value_node), field=f"{path}.{limit}") from exc
        lines[limit] = _line(value_node)
    return QuotaSpec(kind=kind, name=name, values=values, lines=lines, line=_line(node))
