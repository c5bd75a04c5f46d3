"""Load-test scenarios: what a run sends, parsed and checked (pure: no I/O).

A scenario is a plain mapping, stored as JSON in ``inference.LoadScenario`` and written as YAML
by operators (``scenario_from_yaml`` / ``scenario_to_yaml``). Three kinds:

- ``ramp``: concurrency ``steps`` (e.g. ``[1, 2, 4, 8]``), each held ``hold_s`` seconds by as
  many closed-loop virtual users; each user runs sessions back to back.
- ``steady``: one ``concurrency`` held ``hold_s`` seconds, the same way.
- ``agent_sessions``: at each concurrency step, that many sessions start together and the
  step ends when they have all finished (a count, not a time): each one a full agent
  conversation.

Every session is a multi-turn conversation (``conversation: chat`` or ``agent``; ``agent`` is
the default of ``agent_sessions``). An agent conversation shares one system prompt and the tool
schemas (``plan.TOOLS``) across sessions, alternates user turns and tool-result turns, waits
``think_time_s`` between turns, and asks for a tool call (``tool_choice: required``) on a
``tool_call_fraction`` of its user turns (with room for the call: ``tool_max_tokens``); the
call is checked against the tool's schema.
Session length: ``turns`` (a number, or ``{"min": a, "max": b}``, uniform). Every run is
bounded: ``max_s`` seconds (at most ``MAX_S_LIMIT``) and ``max_requests`` requests, and stops
by itself at whichever comes first.

``plan.plan_sessions`` turns a scenario into the exact list of sessions a run will start
(seeded), so progress is known in advance and a resumed run replays the same plan.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import yaml

KINDS = ("ramp", "steady", "agent_sessions")
CONVERSATIONS = ("chat", "agent")
MAX_S_LIMIT = 3600.0
MAX_REQUESTS_LIMIT = 100_000
MAX_CONCURRENCY = 1024
DEFAULT_TARGET_P95_S = 0.3  # the design brief's target: P95 under 300 ms (ARCHITECTURE.md)


class BadScenario(ValueError):
    """A scenario field is wrong; ``field`` names it (dotted), the message says why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class Range:
    """A uniform range ``[low, high]`` (equal ends: a fixed value)."""

    low: float
    high: float

    def draw(self, rng: random.Random) -> float:
        return self.low if self.low == self.high else rng.uniform(self.low, self.high)

    def as_spec(self) -> float | dict[str, float]:
        return self.low if self.low == self.high else {"min": self.low, "max": self.high}

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2


@dataclass(frozen=True)
class Scenario:
    """A checked scenario (``parse_scenario``); ``steps`` is the concurrency of each step."""

    name: str
    kind: str
    steps: tuple[int, ...]
    conversation: str
    hold_s: float = 30.0
    turns: Range = Range(4, 4)
    think_time_s: Range = Range(0, 0)
    tool_call_fraction: float = 0.0
    max_tokens: int = 32
    tool_max_tokens: int = 96
    target_p95_s: float = DEFAULT_TARGET_P95_S
    max_s: float = 600.0
    max_requests: int = 10_000
    model: str = ""
    seed: int = 1
    description: str = ""

    def as_spec(self) -> dict[str, Any]:
        """The scenario as the mapping ``parse_scenario`` reads (round trip)."""
        spec: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.description:
            spec["description"] = self.description
        if self.kind == "steady":
            spec["concurrency"] = self.steps[0]
        else:
            spec["steps"] = list(self.steps)
        if self.kind != "agent_sessions":
            spec["hold_s"] = self.hold_s
        spec.update(
            conversation=self.conversation,
            turns=_int_spec(self.turns),
            think_time_s=self.think_time_s.as_spec(),
            tool_call_fraction=self.tool_call_fraction,
            max_tokens=self.max_tokens,
            tool_max_tokens=self.tool_max_tokens,
            target_p95_s=self.target_p95_s,
            max_s=self.max_s,
            max_requests=self.max_requests,
            seed=self.seed,
        )
        if self.model:
            spec["model"] = self.model
        return spec

    @property
    def timed(self) -> bool:
        """Steps end on time (ramp, steady), not when their sessions end."""
        return self.kind != "agent_sessions"


def _int_spec(r: Range) -> int | dict[str, int]:
    return int(r.low) if r.low == r.high else {"min": int(r.low), "max": int(r.high)}


_FIELDS = {
    "name",
    "kind",
    "description",
    "steps",
    "concurrency",
    "hold_s",
    "conversation",
    "turns",
    "think_time_s",
    "tool_call_fraction",
    "max_tokens",
    "tool_max_tokens",
    "target_p95_s",
    "max_s",
    "max_requests",
    "model",
    "seed",
}


def parse_scenario(spec: Any) -> Scenario:
    """A ``Scenario`` from its mapping. Raises ``BadScenario`` naming the first wrong field:
    an unknown field, a wrong type, a value out of range (concurrency 1..1024, ``max_s`` up to
    one hour, fractions 0..1)."""
    if not isinstance(spec, dict):
        raise BadScenario("scenario", "must be a mapping of fields")
    unknown = sorted((str(k) for k in set(spec) - _FIELDS), key=str)
    if unknown:
        raise BadScenario(
            _shown(unknown[0]).strip("'"), f"unknown field (known: {', '.join(sorted(_FIELDS))})"
        )
    name = _name(spec.get("name"))
    kind = spec.get("kind", "ramp")
    if kind not in KINDS:
        raise BadScenario("kind", f"must be one of {', '.join(KINDS)}, not {_shown(kind)}")
    steps = _steps(spec, kind)
    conversation = spec.get("conversation", "agent" if kind == "agent_sessions" else "chat")
    if conversation not in CONVERSATIONS:
        raise BadScenario("conversation", f"must be chat or agent, not {_shown(conversation)}")
    turns = _range(spec.get("turns", 4), "turns", low=1, high=64, integer=True)
    fraction = _number(
        spec.get("tool_call_fraction", 0.5 if conversation == "agent" else 0.0),
        "tool_call_fraction",
        0.0,
        1.0,
    )
    if conversation == "chat" and fraction:
        raise BadScenario("tool_call_fraction", "needs conversation: agent (chat has no tools)")
    return Scenario(
        name=name,
        kind=kind,
        steps=steps,
        conversation=conversation,
        hold_s=_number(spec.get("hold_s", 30.0), "hold_s", 1.0, MAX_S_LIMIT),
        turns=turns,
        think_time_s=_range(spec.get("think_time_s", 0.0), "think_time_s", low=0, high=600),
        tool_call_fraction=fraction,
        max_tokens=int(_number(spec.get("max_tokens", 32), "max_tokens", 1, 1024, integer=True)),
        tool_max_tokens=int(
            _number(spec.get("tool_max_tokens", 96), "tool_max_tokens", 16, 1024, integer=True)
        ),
        target_p95_s=_number(
            spec.get("target_p95_s", DEFAULT_TARGET_P95_S), "target_p95_s", 0.001, 600.0
        ),
        max_s=_number(spec.get("max_s", 600.0), "max_s", 1.0, MAX_S_LIMIT),
        max_requests=int(
            _number(
                spec.get("max_requests", 10_000),
                "max_requests",
                1,
                MAX_REQUESTS_LIMIT,
                integer=True,
            )
        ),
        model=_text(spec.get("model", ""), "model", 128),
        seed=int(_number(spec.get("seed", 1), "seed", 0, 2**31, integer=True)),
        description=_text(spec.get("description", ""), "description", 500),
    )


def _name(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BadScenario("name", "give the scenario a name")
    value = value.strip()
    if (
        len(value) > 64
        or not all(c.isascii() and (c.isalnum() or c in "-_.") for c in value)
        or value.startswith(".")
    ):
        raise BadScenario("name", "1 to 64 letters, digits, '-', '_' or '.' (not first)")
    return value


def _text(value: Any, field: str, limit: int) -> str:
    if not isinstance(value, str):
        raise BadScenario(field, "must be text")
    if len(value) > limit:
        raise BadScenario(field, f"at most {limit} characters")
    return value.strip()


def _shown(value: Any, limit: int = 60) -> str:
    """A value as an error message quotes it: its repr, cut (YAML aliases can make a huge one)."""
    if not isinstance(value, (str, int, float, bool, type(None))):
        return f"a {type(value).__name__}"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _number(value: Any, field: str, low: float, high: float, *, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadScenario(field, f"must be a number, not {_shown(value)}")
    if not math.isfinite(value):
        raise BadScenario(field, f"must be a finite number, not {_shown(value)}")
    if integer and value != int(value):
        raise BadScenario(field, f"must be a whole number, not {_shown(value)}")
    if not low <= value <= high:
        raise BadScenario(field, f"must be between {low:g} and {high:g}, not {_shown(value)}")
    return float(value)


def _range(value: Any, field: str, *, low: float, high: float, integer: bool = False) -> Range:
    if isinstance(value, dict):
        extra = set(value) - {"min", "max"}
        if extra or not {"min", "max"} <= set(value):
            raise BadScenario(field, "a number or {min: a, max: b}")
        a = _number(value["min"], f"{field}.min", low, high, integer=integer)
        b = _number(value["max"], f"{field}.max", low, high, integer=integer)
        if a > b:
            raise BadScenario(field, f"min {a:g} is above max {b:g}")
        return Range(a, b)
    n = _number(value, field, low, high, integer=integer)
    return Range(n, n)


def _steps(spec: dict[str, Any], kind: str) -> tuple[int, ...]:
    if kind == "steady":
        if "steps" in spec:
            raise BadScenario("steps", "a steady scenario has one concurrency: give concurrency")
        c = (
            _number(spec.get("concurrency"), "concurrency", 1, MAX_CONCURRENCY, integer=True)
            if "concurrency" in spec
            else None
        )
        if c is None:
            raise BadScenario("concurrency", "give the number of concurrent sessions")
        return (int(c),)
    if "concurrency" in spec:
        raise BadScenario("concurrency", f"a {kind} scenario takes steps: [1, 2, 4, ...]")
    steps = spec.get("steps")
    if not isinstance(steps, list) or not steps:
        raise BadScenario("steps", "a list of concurrency levels, e.g. [1, 2, 4, 8]")
    if len(steps) > 32:
        raise BadScenario("steps", "at most 32 steps")
    levels = tuple(
        int(_number(s, f"steps[{i}]", 1, MAX_CONCURRENCY, integer=True))
        for i, s in enumerate(steps)
    )
    if any(b <= a for a, b in zip(levels, levels[1:], strict=False)):
        raise BadScenario("steps", "concurrency must rise from step to step, e.g. [1, 2, 4, 8]")
    return levels


MAX_YAML_CHARS = 64_000  # a scenario is a screenful; the built-ins are under 600
MAX_YAML_DEPTH = 8  # a scenario nests two levels ({turns: {min, max}}); room to spare


def _bounded(text: str) -> None:
    """``BadScenario`` (field ``yaml``) for text over ``MAX_YAML_CHARS`` or nesting deeper than
    ``MAX_YAML_DEPTH``, checked on the parser's events (no recursion, no object built) before
    anything is constructed: PyYAML's composer recurses once per level, so a deep document
    would raise ``RecursionError``, which is no ``YAMLError``."""
    if len(text) > MAX_YAML_CHARS:
        raise BadScenario("yaml", f"at most {MAX_YAML_CHARS:,} characters, not {len(text):,}")
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark else 0
                raise BadScenario(
                    "yaml", f"nested more than {MAX_YAML_DEPTH} levels deep (at line {line})"
                )
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def scenario_from_yaml(text: str) -> Scenario:
    """Parse a YAML scenario; ``BadScenario`` (field ``yaml``, with the line) when it is not
    YAML, is longer than ``MAX_YAML_CHARS`` or nests deeper than ``MAX_YAML_DEPTH``,
    otherwise as ``parse_scenario``."""
    if not isinstance(text, str):
        raise BadScenario("yaml", "must be text")
    try:
        _bounded(text)
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise BadScenario("yaml", f"not valid YAML{where}: {getattr(exc, 'problem', exc)}") from exc
    return parse_scenario(spec)


def scenario_to_yaml(scenario: Scenario) -> str:
    """The scenario as YAML (``scenario_from_yaml`` reads it back to an equal scenario)."""
    return yaml.safe_dump(scenario.as_spec(), sort_keys=False)


# --- built-in scenarios ------------------------------------------------------------------------

BUILTIN: dict[str, dict[str, Any]] = {
    "ramp-quick": {
        "name": "ramp-quick",
        "kind": "ramp",
        "description": "Plain multi-turn chat, 1 -> 2 -> 4 -> 8 concurrent users, 15 s each.",
        "steps": [1, 2, 4, 8],
        "hold_s": 15,
        "conversation": "chat",
        "turns": {"min": 2, "max": 4},
        "max_tokens": 24,
        "max_s": 150,
        "max_requests": 2000,
    },
    "agent-sessions-quick": {
        "name": "agent-sessions-quick",
        "kind": "agent_sessions",
        "description": "Tool-calling agent sessions, 1 -> 2 -> 4 -> 8 at once, 4 turns each.",
        "steps": [1, 2, 4, 8],
        "turns": 4,
        "think_time_s": {"min": 0.1, "max": 0.4},
        "tool_call_fraction": 0.5,
        "max_tokens": 24,
        "max_s": 170,
        "max_requests": 1000,
    },
    "agent-sessions": {
        "name": "agent-sessions",
        "kind": "agent_sessions",
        "description": "The design brief's ramp: 1, 2, 4, 8, 16, 32 agent sessions at once, "
        "8 turns each (a quarter of the user turns must call a tool).",
        "steps": [1, 2, 4, 8, 16, 32],
        "turns": 8,
        "think_time_s": {"min": 0.2, "max": 0.8},
        "tool_call_fraction": 0.25,
        "max_tokens": 16,
        "max_s": 590,
        "max_requests": 5000,
    },
}
