"""A replay of agent traffic in which requests repeat with natural variation, for
``bench/semantic_cache.py``: each session asks one question (a stateless first turn) and makes
two tool calls. What is asked is drawn by popularity (Zipf, s = 1.1, over every intent and
entity), so popular things come back, phrased another way (paraphrase templates, arguments
in another key order or spacing), and near-misses come naturally (the same intent with
another city, day, number, order or symbol). Every request carries its ``intent``: two
requests with the same intent must get the same answer, so a hit whose entry was stored for
another intent is a false hit. Seeded: the same seed gives the same traffic.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

QUESTIONS = {
    "capital": (
        ["France", "Japan", "Kenya", "Peru", "Norway", "Egypt", "Canada", "Chile"],
        [
            "What is the capital of {0}?",
            "Tell me the capital of {0}.",
            "Which city is the capital of {0}?",
            "What's the capital city of {0}?",
        ],
    ),
    "weather": (
        [
            (c, d)
            for c in ("Paris", "Tokyo", "Berlin", "Madrid", "Seoul")
            for d in ("today", "tomorrow")
        ],
        [
            "What's the weather in {0} {1}?",
            "How is the weather in {0} {1}?",
            "What is the weather like in {0} {1}?",
        ],
    ),
    "convert": (
        [5, 12, 26, 42, 100],
        [
            "Convert {0} miles to kilometers.",
            "How many kilometers is {0} miles?",
            "What is {0} miles in kilometers?",
        ],
    ),
    "order": (
        ["A-1042", "A-1043", "B-2210", "C-0007"],
        [
            "Where is my order {0}?",
            "What's the status of order {0}?",
            "Can you check the status of order {0}?",
        ],
    ),
    "explain": (
        ["photosynthesis", "inflation", "recursion", "compound interest"],
        [
            "Explain {0} in simple terms.",
            "Can you explain {0} simply?",
            "Give me a simple explanation of {0}.",
        ],
    ),
}

SEARCHES = {
    "flights Rome": ["cheap flights to Rome", "low-cost flights to Rome", "cheap flights Rome"],
    "flights Oslo": ["cheap flights to Oslo", "low-cost flights to Oslo", "cheap flights Oslo"],
    "sourdough": [
        "how to bake sourdough bread",
        "how do I bake sourdough bread",
        "sourdough bread how to bake",
    ],
    "python sort": ["python sort a list of dicts by key", "sort list of dicts by key in python"],
    "visa Japan": ["visa requirements for Japan", "Japan visa requirements"],
}


@dataclass(frozen=True)
class Request:
    kind: str  # "answer" or "tool"
    namespace: str  # answers:<model> or tools:<tool>
    text: str  # what the cache compares (a question, or ``tool {json}``)
    intent: str  # equal intents, equal answers


def _tool(tool: str, arguments: dict, intent: str, rng: random.Random) -> Request:
    items = list(arguments.items())
    rng.shuffle(items)  # the agent writes the keys in any order
    spacing = rng.choice([(", ", ": "), (",", ":"), (" , ", " : ")])
    text = f"{tool} " + json.dumps(dict(items), separators=spacing, ensure_ascii=False)
    return Request("tool", f"tools:{tool}", text, intent)


def _tool_calls() -> list:
    """Every (intent, make) of a tool call: make(rng) writes one call of that intent."""
    calls = []
    for city in ("Paris", "Tokyo", "Berlin", "Madrid", "Seoul"):
        for days in (1, 3):
            args = {"city": city, "days": days}
            calls.append(
                (
                    f"get_weather {city} {days}",
                    lambda r, a=args, i=f"w{city}{days}": _tool("get_weather", a, i, r),
                )
            )
    for intent, phrasings in SEARCHES.items():
        calls.append(
            (
                intent,
                lambda r, p=phrasings, i=intent: _tool("search_web", {"query": r.choice(p)}, i, r),
            )
        )
    for order in ("A-1042", "A-1043", "B-2210", "C-0007"):
        calls.append(
            (
                f"order {order}",
                lambda r, o=order: _tool("lookup_order", {"order_id": o}, f"o{o}", r),
            )
        )
    for symbol in ("AAPL", "MSFT", "NVDA"):
        calls.append(
            (
                f"stock {symbol}",
                lambda r, s=symbol: _tool("get_stock_price", {"symbol": s}, f"s{s}", r),
            )
        )
    return calls


def _questions(model: str) -> list:
    out = []
    for name, (entities, templates) in QUESTIONS.items():
        for entity in entities:
            slots = entity if isinstance(entity, tuple) else (entity,)
            intent = f"{name}:{'|'.join(map(str, slots))}"
            out.append(
                (
                    intent,
                    lambda r, t=templates, s=slots, i=intent: Request(
                        "answer", f"answers:{model}", r.choice(t).format(*s), i
                    ),
                )
            )
    return out


def _zipf(rng: random.Random, items: list, s: float = 1.1):
    order = items[:]
    rng.shuffle(order)  # popularity unrelated to the list's order
    weights = [1 / (rank + 1) ** s for rank in range(len(order))]
    return lambda: rng.choices(order, weights)[0]


ONE_OFF_QUESTIONS = 0.4  # share of questions asked once only (the long tail)
ONE_OFF_TOOL_CALLS = 0.3


def _one_off_question(rng: random.Random, model: str, n: int) -> Request:
    town = f"{rng.choice(['North', 'South', 'East', 'West', 'Port', 'Lake'])}{rng.choice(['field', 'ton', 'bury', 'haven', 'mouth'])}"
    text = rng.choice(
        [
            f"How many people lived in {town} in {1900 + n % 120}?",
            f"Write a haiku about {town} and the number {n}.",
            f"What is {n} times {n % 97 + 3}?",
        ]
    )
    return Request("answer", f"answers:{model}", text, f"one-off:{n}")


def _one_off_call(rng: random.Random, n: int) -> Request:
    query = f"{rng.choice(['reviews of', 'opening hours of', 'directions to'])} shop {n}"
    return _tool("search_web", {"query": query}, f"one-off:{n}", rng)


def traffic(sessions: int, seed: int = 7, model: str = "smollm2") -> list[Request]:
    """``sessions`` x (one question, two tool calls), in session order: popular requests
    drawn by ``_zipf``, and a long tail of one-offs that are never asked again."""
    rng = random.Random(seed)
    question, tool = _zipf(rng, _questions(model)), _zipf(rng, _tool_calls())
    out = []
    for n in range(sessions):
        if rng.random() < ONE_OFF_QUESTIONS:
            out.append(_one_off_question(rng, model, n))
        else:
            out.append(question()[1](rng))
        for k in range(2):
            if rng.random() < ONE_OFF_TOOL_CALLS:
                out.append(_one_off_call(rng, 2 * n + k))
            else:
                out.append(tool()[1](rng))
    return out
