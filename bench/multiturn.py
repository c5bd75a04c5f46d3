"""8 interleaved agent sessions on one node, 10 turns each: per-session KV reuse against none.

Each session starts with a system prompt carrying tool schemas (about 600 tokens); every turn
adds a user message or a tool result (about 100 tokens) and generates up to 40 tokens (greedy).
The peer is the same engine started with ``--no-prefix-reuse``, so every turn prefills the whole
history. ``ratio`` = mean turn latency without reuse / with reuse.

Fair to the peer: both sides run the same workload. The assistant turns put back into the
history are scripted (the same text on both sides, whatever the model generated), so both sides
see the same histories; decoding is greedy, and the prompt and completion token counts of each
side are reported. Both nodes run for the whole benchmark and are measured one at a time in
rounds whose first side alternates (reuse first, then no-reuse first, ...), each round with its
own sessions and system-prompt tag, so no round inherits another's KV and drift on a busy
machine does not land on one side.

    python bench/multiturn.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import httpx
from harness import emit, percentile, start_node, stream_chat

TOOLS = [
    {
        "name": name,
        "description": f"{desc} Use it whenever the user asks about {topic}; it returns JSON.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": f"What to look up about {topic}."},
                "limit": {"type": "integer", "description": "Maximum number of results to return."},
                "region": {
                    "type": "string",
                    "description": "ISO country code to restrict the search to.",
                },
            },
            "required": ["query"],
        },
    }
    for name, desc, topic in [
        ("search_flights", "Search flights between two airports on a date.", "air travel"),
        ("book_hotel", "Book a hotel room in a city for given nights.", "hotels"),
        ("get_weather", "Current weather and a five-day forecast for a city.", "weather"),
        ("convert_currency", "Convert an amount between two currencies at today's rate.", "money"),
        ("lookup_order", "Find a customer's order by its number and show its status.", "orders"),
        ("create_ticket", "Open a support ticket with a title, body and priority.", "support"),
    ]
]
SYSTEM = (
    "You are a travel and support agent. Think step by step, call tools when needed and keep "
    "answers short.\n# Tools\n" + "\n".join(json.dumps(t) for t in TOOLS)
)


def turn_message(session: int, turn: int) -> dict:
    if turn % 2:
        payload = {
            "results": [
                {
                    "id": f"R{session}{turn}{k}",
                    "price": 100 + 7 * k + turn,
                    "city": "Lisbon",
                    "status": "confirmed",
                    "note": "window seat, breakfast included",
                }
                for k in range(3)
            ]
        }
        return {
            "role": "tool",
            "tool_call_id": f"call_{session}_{turn}",
            "content": json.dumps(payload),
        }
    return {
        "role": "user",
        "content": (
            f"Session {session}, step {turn}: I need to travel from Oslo to Lisbon next week with my family "
            "of four, we prefer morning flights and a hotel near the old town with breakfast. Please also "
            "check the weather there and convert 500 euros to Norwegian kroner for me, thanks."
        ),
    }


def scripted_reply(session: int, turn: int) -> str:
    """The assistant turn put back into the history (about 40 tokens), the same on both sides."""
    return (
        f"Step {turn} for session {session}: I checked the morning flights from Oslo and two "
        "hotels near the old town with breakfast; the forecast is sunny and 500 euros is about "
        "5,800 kroner. Shall I book the first option?"
    )


async def session(
    client: httpx.AsyncClient, url: str, tag: str, sid: int, turns: int, out: dict
) -> None:
    messages = [{"role": "system", "content": f"[{tag}] {SYSTEM}"}]
    for turn in range(turns):
        messages.append(turn_message(sid, turn))
        body = {"messages": messages, "max_tokens": 40, "temperature": 0}
        start = time.perf_counter()
        result = await stream_chat(client, url, body, headers={"X-Session-Id": f"{tag}-{sid}"})
        out["latencies"].append(time.perf_counter() - start)
        usage = result.usage or {}
        out["prompt_tokens"] += usage.get("prompt_tokens", 0)
        out["completion_tokens"] += usage.get("completion_tokens", result.tokens)
        out["cached_tokens"] += (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        messages.append({"role": "assistant", "content": scripted_reply(sid, turn)})


async def measure(url: str, tag: str, sessions: int, turns: int, headers: dict, out: dict) -> None:
    async with httpx.AsyncClient(timeout=600, headers=headers) as client:
        start = time.perf_counter()
        await asyncio.gather(*(session(client, url, tag, s, turns, out) for s in range(sessions)))
        out["wall_s"] += time.perf_counter() - start


def summary(out: dict) -> dict:
    latencies = out["latencies"]
    return {
        "turns": len(latencies),
        "mean_turn_s": round(sum(latencies) / len(latencies), 3),
        "p95_turn_s": round(percentile(latencies, 95), 3),
        "wall_s": round(out["wall_s"], 2),
        "prompt_tokens": out["prompt_tokens"],
        "cached_tokens": out["cached_tokens"],
        "completion_tokens": out["completion_tokens"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--quick", action="store_true", help="2 rounds of 2 sessions x 3 turns, within 60 s"
    )
    args = parser.parse_args()
    sessions, turns, rounds = (2, 3, 2) if args.quick else (8, 10, 2)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-multiturn-"))
    node_args = ["--sequences", str(sessions), "--ctx-per-seq", "4096"]
    sides: dict[str, object] = {}
    out = {
        name: {
            "latencies": [],
            "prompt_tokens": 0,
            "cached_tokens": 0,
            "completion_tokens": 0,
            "wall_s": 0.0,
        }
        for name in ("with_reuse", "without_reuse")
    }
    try:
        sides["with_reuse"] = start_node("reuse", log_dir, threads=2, extra_args=node_args)
        sides["without_reuse"] = start_node(
            "no-reuse", log_dir, threads=2, extra_args=[*node_args, "--no-prefix-reuse"]
        )
        for r in range(rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                proc = sides[name]
                asyncio.run(
                    measure(proc.url, f"round {r}", sessions, turns, proc.headers, out[name])
                )
    finally:
        for proc in sides.values():
            proc.stop()
    reuse, none = summary(out["with_reuse"]), summary(out["without_reuse"])
    print(
        f"mean turn latency: with reuse {reuse['mean_turn_s']} s, without {none['mean_turn_s']} s; "
        f"completion tokens {reuse['completion_tokens']} vs {none['completion_tokens']}"
    )
    emit(
        {
            "bench": "multiturn",
            "quick": args.quick,
            "sessions": sessions,
            "turns": turns,
            "rounds": rounds,
            "with_reuse": reuse,
            "without_reuse": none,
            "ratio": round(none["mean_turn_s"] / reuse["mean_turn_s"], 2),
        }
    )


if __name__ == "__main__":
    main()
