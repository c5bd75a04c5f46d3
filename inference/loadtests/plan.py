"""What a load test's sessions say, and the plan of every session a run starts (pure: no I/O).

An agent conversation shares one system prompt (``SYSTEM_PROMPT``) and three tool schemas
(``TOOLS``) across sessions; its user turns come from ``USER_TURNS``, a chat's from
``CHAT_TURNS``, and a tool call is answered with its canned result (``tool_result_text``).
``plan_sessions`` turns a checked ``scenario.Scenario`` into the exact list of sessions a run
will start, seeded by the scenario's seed, the step and the session's index, so progress is
known in advance and a resumed run replays the same plan.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from inference.loadtests.scenario import Scenario

SYSTEM_PROMPT = (
    "You are an operations agent for a small online shop. Use the tools when the user asks "
    "for something they can do; otherwise answer in one or two short sentences."
)

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_order_status",
            "description": "Look up the delivery status of an order.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string", "description": "e.g. A-1042"}},
                "required": ["order_id"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_products",
            "description": "Search the catalogue.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "max_results": {"type": "integer", "minimum": 1, "maximum": 10},
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "create_ticket",
            "description": "Open a support ticket.",
            "parameters": {
                "type": "object",
                "properties": {
                    "title": {"type": "string"},
                    "priority": {"type": "string", "enum": ["low", "normal", "high"]},
                },
                "required": ["title", "priority"],
                "additionalProperties": False,
            },
        },
    },
]

USER_TURNS = (
    "Where is my order A-{n}?",
    "Find me {n} cheap USB-C cables.",
    "My parcel arrived damaged, please open a ticket.",
    "Do you ship to Norway?",
    "What is the status of order B-{n}?",
    "Search for a waterproof jacket.",
    "Thanks. Can you summarise what you found?",
    "Open a high priority ticket: the checkout page fails.",
)
TOOL_RESULTS = {
    "get_order_status": '{{"order_id": "A-{n}", "status": "in transit", "eta_days": 2}}',
    "search_products": '{{"results": [{{"name": "Cable {n}", "price": 4.5}}]}}',
    "create_ticket": '{{"ticket": "T-{n}", "state": "open"}}',
}
CHAT_TURNS = (
    "Write two sentences about the sea.",
    "Now make it about mountains.",
    "Give it a title.",
    "Explain it to a child in one sentence.",
    "Name three colours that fit it.",
    "Shorten the title to two words.",
)


# --- the plan: every session a run will start ---------------------------------------------------


@dataclass(frozen=True)
class TurnPlan:
    """One planned turn: a user message (``tool_required``: it must produce a tool call), sent
    after ``think_s`` seconds (0 for a session's first turn). When the turn before produced a
    tool call, the runner sends that call's result in this turn's place instead (a
    tool-result turn), after the same think time: a session is always ``len(turns)``
    requests."""

    kind: str
    text: str
    tool_required: bool = False
    think_s: float = 0.0


@dataclass(frozen=True)
class SessionPlan:
    """One session: its key (the ``X-Session-Id`` it sends), step index and planned turns."""

    session_id: str
    step: int
    turns: tuple[TurnPlan, ...] = field(default_factory=tuple)


def plan_turns(scenario: Scenario, rng: random.Random) -> tuple[TurnPlan, ...]:
    """The turns of one session: its length drawn from ``turns``, think times from
    ``think_time_s``, tool calls required on ``tool_call_fraction`` of the user turns."""
    count = rng.randint(int(scenario.turns.low), int(scenario.turns.high))
    pool = USER_TURNS if scenario.conversation == "agent" else CHAT_TURNS
    turns = []
    for i in range(count):
        text = pool[(i + rng.randrange(len(pool))) % len(pool)].format(n=rng.randrange(1000, 9999))
        required = scenario.conversation == "agent" and rng.random() < scenario.tool_call_fraction
        think = scenario.think_time_s.draw(rng) if i else 0.0
        turns.append(TurnPlan("user", text, tool_required=required, think_s=round(think, 3)))
    return tuple(turns)


def plan_session(scenario: Scenario, *, session_id: str, step: int, index: int) -> SessionPlan:
    """Session ``index`` of step ``step``, seeded by the scenario's seed, the step and the
    index (the same plan every time), sending ``session_id`` as its key."""
    rng = random.Random(f"{scenario.seed}:{step}:{index}")
    return SessionPlan(session_id, step, plan_turns(scenario, rng))


def plan_sessions(scenario: Scenario, *, run_tag: str, step: int, count: int) -> list[SessionPlan]:
    """``count`` sessions of step ``step`` (``plan_session``), keyed ``lt-<run_tag>-s<step>-<i>``."""
    return [
        plan_session(scenario, session_id=f"lt-{run_tag}-s{step}-{i}", step=step, index=i)
        for i in range(count)
    ]


def tool_result_text(name: str, n: int) -> str:
    """The canned result of tool ``name`` (what the agent's tool returned)."""
    return TOOL_RESULTS.get(name, '{{"ok": true, "n": {n}}}').format(n=n)


def tool_schemas() -> dict[str, dict[str, Any]]:
    """``{tool name: its JSON-schema parameters}``."""
    return {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
