"""The config file's shapes: errors, the parsed file (``ArraySpec``) and an apply's report."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from inference.models import RoutingPolicy

_ADDRESS = re.compile(r"^[A-Za-z0-9.\-]+:\d{1,5}$|^\[[0-9A-Fa-f:.]+\]:\d{1,5}$")
_HEADER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9\-]{0,63}$")
_NODE_ID = re.compile(r"^[-a-zA-Z0-9_]{1,64}$")
_CPU_SET = re.compile(r"^$|^\d+(-\d+)?(,\d+(-\d+)?)*$")
_KIND = re.compile(r"^(phalanx|external)$")
_SERVED_NAME = re.compile(r"^\S{1,128}$")
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
    address: str | None  # None: keep the node's (required for a new node)
    weight: float | None = None
    affinity: bool | None = None
    cpu_set: str | None = None
    threads: int | None = None
    package: str | None = None  # "name:version"; else inference.model_path's, else unchanged
    max_sessions: int | None = None
    kv_budget_tokens: int | None = None
    kind: str | None = None  # "phalanx" or "external" (an OpenAI-compatible server)
    served_name: str | None = None  # the model name clients ask it for (external: required)
    where: str = ""  # "pool.nodes[2]", for errors found on apply
    line: int | None = None


@dataclass(frozen=True)
class QuotaSpec:
    """One entry of the ``quotas`` section: a role's default (``kind`` "roles") or a token's
    quota (``kind`` "tokens", by the token's name). ``values``: the limits the entry gives
    (None: blank), each at its ``lines[limit]``."""

    kind: str
    name: str
    values: dict[str, int | None]
    lines: dict[str, int]
    line: int

    @property
    def where(self) -> str:
        return f"quotas.{self.kind}.{self.name}"


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
    quotas: list[QuotaSpec] | None = None  # roles' defaults, then tokens' quotas


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


def _num(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value
