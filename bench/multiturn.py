"""8 interleaved agent sessions on one node, 10 turns each: per-session KV reuse against none.

Each session starts with a system prompt carrying tool schemas (about 600 tokens); every turn
adds a user message or a tool result (about 100 tokens) and generates about 40 tokens. The peer
is the same engine started with ``--no-prefix-reuse``, so every turn prefills the whole history.
``ratio`` = mean turn latency without reuse / with reuse.

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


async def session(
    client: httpx.AsyncClient, url: str, sid: int, turns: int, latencies: list[float]
) -> None:
    messages = [{"role": "system", "content": SYSTEM}]
    for turn in range(turns):
        messages.append(turn_message(sid, turn))
        body = {
            "messages": messages,
            "max_tokens": 40,
            "temperature": 0.7,
            "seed": sid * 100 + turn,
        }
        start = time.perf_counter()
        result = await stream_chat(client, url, body, headers={"X-Session-Id": f"agent-{sid}"})
        latencies.append(time.perf_counter() - start)
        messages.append({"role": "assistant", "content": result.text})


async def measure(url: str, sessions: int, turns: int, headers: dict) -> dict:
    latencies: list[float] = []
    async with httpx.AsyncClient(timeout=600, headers=headers) as client:
        start = time.perf_counter()
        await asyncio.gather(*(session(client, url, s, turns, latencies) for s in range(sessions)))
        wall = time.perf_counter() - start
    return {
        "turns": len(latencies),
        "mean_turn_s": round(sum(latencies) / len(latencies), 3),
        "p95_turn_s": round(percentile(latencies, 95), 3),
        "wall_s": round(wall, 2),
    }


def run_node(name: str, log_dir: Path, sessions: int, turns: int, extra: list[str]) -> dict:
    proc = start_node(
        name,
        log_dir,
        threads=2,
        extra_args=["--sequences", str(sessions), "--ctx-per-seq", "4096", *extra],
    )
    try:
        result = asyncio.run(measure(proc.url, sessions, turns, proc.headers))
        result["metrics"] = {
            line.split("{")[0]: float(line.rsplit(" ", 1)[1])
            for line in httpx.get(f"{proc.url}/metrics", headers=proc.headers).text.splitlines()
            if line.startswith(
                ("phalanx_node_reused_token_ratio", "phalanx_node_prompt_tokens_total")
            )
        }
        return result
    finally:
        proc.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="2 sessions x 3 turns, within 60 s")
    args = parser.parse_args()
    sessions, turns = (2, 3) if args.quick else (8, 10)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-multiturn-"))
    reuse = run_node("reuse", log_dir, sessions, turns, [])
    none = run_node("no-reuse", log_dir, sessions, turns, ["--no-prefix-reuse"])
    print(
        f"mean turn latency: with reuse {reuse['mean_turn_s']} s, without {none['mean_turn_s']} s"
    )
    emit(
        {
            "bench": "multiturn",
            "quick": args.quick,
            "sessions": sessions,
            "turns": turns,
            "with_reuse": reuse,
            "without_reuse": none,
            "ratio": round(none["mean_turn_s"] / reuse["mean_turn_s"], 2),
        }
    )


if __name__ == "__main__":
    main()
