"""Pure parts of a rolling upgrade: its settings, its batches, and the bake comparison.

Nothing here touches the database or a node; ``inference.upgrades.driver`` does, one step per
control-loop tick, and tests check these functions with plain data.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from nodes.agent.engine_settings import LIMITS as NODE_SETTING_LIMITS
from nodes.agent.engine_settings import context_refusal

DEFAULTS: dict[str, Any] = {
    "max_unavailable": 1,  # nodes switched at once (a batch)
    "canary_share": 0.25,  # new sessions to the new version while the first batch bakes
    "bake_s": 30.0,  # seconds each batch serves before the next starts
    "drain_timeout_s": 120.0,  # longest wait for pinned sessions to leave a draining node
    "switch_timeout_s": 300.0,  # longest wait for a node to load the new package
    "max_error_rate_increase": 0.02,  # new error rate may exceed the old by this (absolute)
    "max_ttft_ratio": 1.5,  # new TTFT P95 may be at most this times the old
    "ttft_slack_s": 0.25,  # ... plus this (small P95s jitter by more than a ratio)
    "min_requests": 3,  # fewer requests on either side: the bake cannot compare (skipped)
    "no_traffic": "pause",  # a bake that compared nothing, after waiting: pause or proceed
}
LIMITS: dict[str, tuple[float, float]] = {
    "max_unavailable": (1, 64),
    "canary_share": (0.0, 1.0),
    "bake_s": (0.0, 86_400.0),
    "drain_timeout_s": (0.0, 86_400.0),
    "switch_timeout_s": (10.0, 3_600.0),
    "max_error_rate_increase": (0.0, 1.0),
    "max_ttft_ratio": (1.0, 100.0),
    "ttft_slack_s": (0.0, 60.0),
    "min_requests": (0, 1_000_000),
}
INTEGERS = ("max_unavailable", "min_requests")
# settings that are one of a few words, not numbers
CHOICES: dict[str, tuple[str, ...]] = {"no_traffic": ("pause", "proceed")}

# node_settings an upgrade may roll and their bounds, inclusive (``NODE_SETTING_LIMITS``, the
# node's own ``PUT /package`` check too: ``nodes.agent.engine_settings``); ``ctx_per_seq`` is
# also at most the package's trained context (``ModelPackage.context_window``).


class BadSettings(ValueError):
    """A setting is unknown or out of range; ``field`` names it."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def settings_with_defaults(given: dict[str, Any] | None) -> dict[str, Any]:
    """``DEFAULTS`` overridden by ``given``. Raises ``BadSettings`` for an unknown key, a
    value that is not a number or one out of ``LIMITS``, or a word not one of ``CHOICES``."""
    out = dict(DEFAULTS)
    for key, value in (given or {}).items():
        if key not in DEFAULTS:
            raise BadSettings(f"{key}: not a setting ({', '.join(DEFAULTS)})", key)
        if key in CHOICES:
            if value not in CHOICES[key]:
                raise BadSettings(f"{key}: one of {', '.join(CHOICES[key])}", key)
            out[key] = value
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BadSettings(f"{key}: a number", key)
        low, high = LIMITS[key]
        if not low <= value <= high:
            raise BadSettings(f"{key}: between {low:g} and {high:g}", key)
        if key in INTEGERS and value != int(value):
            raise BadSettings(f"{key}: a whole number", key)
        out[key] = int(value) if key in INTEGERS else float(value)
    return out


def node_settings_checked(given: dict[str, Any] | None, *, context_window: int) -> dict[str, int]:
    """``given`` node settings, checked: every key one of ``NODE_SETTING_LIMITS``, every value
    a whole number within its bounds, ``ctx_per_seq`` at most ``context_window`` (tokens, the
    package's trained context), ``sequences * ctx_per_seq`` within one node's context when both
    are given (``engine_settings.MAX_CONTEXT_TOKENS``; the node checks the pair it would run
    with too). Returns them as ``{key: int}``; raises ``BadSettings`` naming the first that is
    wrong (``field`` is the key)."""
    out: dict[str, int] = {}
    for key, value in (given or {}).items():
        if key not in NODE_SETTING_LIMITS:
            raise BadSettings(f"{key}: not a setting ({', '.join(NODE_SETTING_LIMITS)})", key)
        low, high = NODE_SETTING_LIMITS[key]
        if key == "ctx_per_seq":
            high = min(high, max(low, int(context_window)))
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadSettings(f"{key}: a whole number from {low} to {high}", key)
        if not low <= value <= high:
            why = " (the package's trained context)" if high == context_window else ""
            raise BadSettings(f"{key}: a whole number from {low} to {high}{why}", key)
        out[key] = value
    if "sequences" in out and "ctx_per_seq" in out:
        refusal = context_refusal(out["sequences"], out["ctx_per_seq"])
        if refusal is not None:
            raise BadSettings(refusal, "sequences")
    return out


def batches(node_ids: list[str], max_unavailable: int) -> list[list[str]]:
    """``node_ids`` (in the order to upgrade them) cut into batches of ``max_unavailable``."""
    size = max(1, int(max_unavailable))
    return [node_ids[i : i + size] for i in range(0, len(node_ids), size)]


def plan_batches(
    loads: dict[str, int], standby: set[str], max_unavailable: int
) -> list[tuple[list[str], bool]]:
    """The batches of an upgrade and whether each is a surge: the ``standby`` nodes (weight 0:
    spare capacity that takes no sessions) all together first, as a surge (they take traffic on
    the new version before any serving node is drained), then the serving nodes by
    ``upgrade_order`` in batches of ``max_unavailable``."""
    surge = sorted(n for n in loads if n in standby)
    serving = upgrade_order({n: c for n, c in loads.items() if n not in standby})
    out = [(surge, True)] if surge else []
    return out + [(batch, False) for batch in batches(serving, max_unavailable)]


def upgrade_order(loads: dict[str, int]) -> list[str]:
    """Node ids by sessions pinned, fewest first (they drain soonest), then by id: the
    emptiest nodes go first, the way a surge onto spare nodes would."""
    return sorted(loads, key=lambda node_id: (loads[node_id], node_id))


@dataclass(frozen=True)
class Side:
    """One version's traffic over a bake: requests, failures, tool calls that did not parse
    (deltas of the nodes' counters) and the worst TTFT P95 (s) among its nodes."""

    requests: float = 0.0
    failed: float = 0.0
    tool_parse_failures: float = 0.0
    ttft_p95: float | None = None

    @property
    def error_rate(self) -> float:
        return self.failed / self.requests if self.requests else 0.0

    @property
    def tool_failure_rate(self) -> float:
        return self.tool_parse_failures / self.requests if self.requests else 0.0

    def plus(self, other: Side) -> Side:
        """Both sides' traffic together (the worse TTFT P95 of the two)."""
        p95s = [p for p in (self.ttft_p95, other.ttft_p95) if p is not None]
        return Side(
            requests=self.requests + other.requests,
            failed=self.failed + other.failed,
            tool_parse_failures=self.tool_parse_failures + other.tool_parse_failures,
            ttft_p95=max(p95s) if p95s else None,
        )

    def as_dict(self) -> dict[str, float | None]:
        return dataclasses.asdict(self)


def comparable(old: Side, new: Side, settings: dict[str, Any]) -> bool:
    """Both sides served at least ``min_requests`` (and at least one) requests: only then do
    their rates say anything."""
    floor = max(1, settings["min_requests"])
    return new.requests >= floor and old.requests >= floor


def skipped_gate(old: Side, new: Side, settings: dict[str, Any]) -> dict[str, Any]:
    """The bake's result when ``comparable`` is False: verdict ``skipped`` (not a pass: it
    compared nothing), its detail naming both sides' requests and the floor."""
    floor = max(1, settings["min_requests"])
    detail = (
        f"skipped: too little traffic to compare ({new.requests:.0f} requests on the new "
        f"version, {old.requests:.0f} on the old; at least {floor:.0f} each)"
    )
    values = {"new_requests": new.requests, "old_requests": old.requests, "min_requests": floor}
    return {
        "gate": "bake",
        "verdict": "skipped",
        "passed": False,
        "detail": detail,
        "values": values,
    }


def bake_gates(old: Side, new: Side, settings: dict[str, Any]) -> list[dict[str, Any]]:
    """The bake's comparisons of ``new`` against ``old``: ``[{"gate", "verdict", "passed",
    "detail", "values"}]`` (``verdict`` ``pass`` or ``fail``; ``passed`` is ``verdict ==
    "pass"``) for the error rate, the tool-call parse failures and the TTFT P95. When the
    sides are not ``comparable``, one ``skipped_gate`` instead: the driver then waits for
    traffic or decides by the upgrade's ``no_traffic`` rule (``inference.upgrades.bake``)."""
    if not comparable(old, new, settings):
        return [skipped_gate(old, new, settings)]
    limit = old.error_rate + settings["max_error_rate_increase"]
    out = [
        _gate(
            "error_rate",
            new.error_rate <= limit + 1e-12,
            f"error rate {new.error_rate:.1%} (new) against {old.error_rate:.1%} (old), at most "
            f"{limit:.1%}",
            {"new": new.error_rate, "old": old.error_rate, "limit": limit},
        ),
        _gate(
            "tool_parse",
            new.tool_failure_rate <= old.tool_failure_rate + settings["max_error_rate_increase"],
            f"tool calls that did not parse {new.tool_failure_rate:.1%} (new) against "
            f"{old.tool_failure_rate:.1%} (old)",
            {"new": new.tool_failure_rate, "old": old.tool_failure_rate},
        ),
    ]
    if new.ttft_p95 is not None and old.ttft_p95 is not None:
        ceiling = old.ttft_p95 * settings["max_ttft_ratio"] + settings["ttft_slack_s"]
        out.append(
            _gate(
                "ttft_p95",
                new.ttft_p95 <= ceiling,
                f"TTFT P95 {new.ttft_p95:.2f} s (new) against {old.ttft_p95:.2f} s (old), at "
                f"most {ceiling:.2f} s",
                {"new": new.ttft_p95, "old": old.ttft_p95, "limit": ceiling},
            )
        )
    return out


def _gate(name: str, passed: bool, detail: str, values: dict[str, Any]) -> dict[str, Any]:
    verdict = "pass" if passed else "fail"
    return {"gate": name, "verdict": verdict, "passed": passed, "detail": detail, "values": values}


def side_from(
    before: dict[str, dict[str, float | None]], after: dict[str, dict[str, float | None]]
) -> Side:
    """A ``Side`` from nodes' load summaries at the bake's start (``before``) and now
    (``after``), ``{node_id: {"requests", "failed", "tool_parse_failures", "ttft_p95"}}``.
    A counter that went down (the node restarted or switched) counts from zero."""
    totals = {"requests": 0.0, "failed": 0.0, "tool_parse_failures": 0.0}
    p95s = []
    for node_id, now in after.items():
        start = before.get(node_id) or {}
        for key in totals:
            end, begin = now.get(key) or 0.0, start.get(key) or 0.0
            totals[key] += end - begin if end >= begin else end
        if now.get("ttft_p95") is not None:
            p95s.append(float(now["ttft_p95"]))
    return Side(**totals, ttft_p95=max(p95s) if p95s else None)
