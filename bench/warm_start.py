"""What a warm start saves: the first turn of an agent session on a node just restarted, with
the shared prefixes it saved (warm) against the same node restarted without them (cold).

First a node serves two sessions of one agent (a ~600-token system prompt with tool schemas),
so the prefix they share is saved to its shelf (``inference/engine/warm.py``). Then, in turns,
the node is restarted with that shelf (warm) and with none (``--prefix-dir ''``: cold), and
the first turn of a new session of the same agent is timed to its first token. Both sides
start the same node the same way and send the same request; only the shelf differs. Reported:
``ttft_cold_s``, ``ttft_warm_s`` (medians) and ``ratio`` = cold / warm (goal >= 5).

    python bench/warm_start.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from harness import emit, start_node, stream_chat

TOOLS = "\n".join(
    f"- {name}(item_id: string, warehouse: string, quantity: integer, note: string): "
    f"{what} an item in a warehouse and returns the new stock level as JSON."
    for name, what in [
        ("reserve_item", "reserves"),
        ("release_item", "releases"),
        ("count_item", "counts"),
        ("move_item", "moves"),
        ("order_item", "orders"),
        ("return_item", "returns"),
        ("inspect_item", "inspects"),
        ("label_item", "labels"),
        ("price_item", "prices"),
        ("audit_item", "audits"),
        ("ship_item", "ships"),
        ("receive_item", "receives"),
        ("weigh_item", "weighs"),
        ("repair_item", "repairs"),
    ]
)
SYSTEM = (
    "You are the stock agent of a warehouse company. You answer in one short sentence and "
    "call a tool when the user asks for a change. Never invent item ids; ask when one is "
    f"missing. Quantities are whole numbers. Tools:\n{TOOLS}\n"
    "Rules: reserve before you ship; count after every move; report errors as they are."
)
NODE_ARGS = ["--sequences", "4", "--ctx-per-seq", "2048", "--threads", "2"]


def shelf_env(home: Path) -> dict[str, str]:
    return {"PHALANX_HOME": str(home), "PHALANX_PREFIX_DIR": str(home / "prefix-cache")}


def turn(session: str, text: str) -> dict:
    return {
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
        "max_tokens": 8,
        "temperature": 0,
        "session": session,
    }


async def first_token_s(node, session: str, text: str) -> tuple[float, int]:
    """(seconds to the first token, prompt tokens reused) of one streamed turn."""
    body = turn(session, text)
    body.pop("session")
    headers = {**node.headers, "X-Session-Id": session}
    async with httpx.AsyncClient(timeout=300) as client:
        result = await stream_chat(client, node.url, body, headers=headers)
    usage = result.usage or {}
    return result.ttft_s, (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def seed_shelf(home: Path, log_dir: Path) -> int:
    """Two sessions of the agent on a node with the shelf, so their prefix is saved; returns
    the prompt tokens of a turn."""
    node = start_node("node-warm", log_dir, extra_args=NODE_ARGS, env=shelf_env(home))
    try:
        for session in ("seed-1", "seed-2"):
            body = turn(session, "How many bolts are in warehouse A?")
            body.pop("session")
            answer = httpx.post(
                f"{node.url}/v1/chat/completions",
                json=body,
                headers={**node.headers, "X-Session-Id": session},
                timeout=300,
            )
        deadline = time.monotonic() + 30
        while not list((home / "prefix-cache").glob("*/*.prefix")):
            assert time.monotonic() < deadline, "the shared prefix was not saved"
            time.sleep(0.2)
        return answer.json()["usage"]["prompt_tokens"]
    finally:
        node.stop()


def restarted_first_turn(home: Path, log_dir: Path, *, warm: bool, round_: int) -> tuple:
    extra = [] if warm else ["--prefix-dir", ""]
    node = start_node("node-warm", log_dir, extra_args=NODE_ARGS + extra, env=shelf_env(home))
    try:
        side = "warm" if warm else "cold"
        return asyncio.run(first_token_s(node, f"{side}-{round_}", "Reserve 3 of item B-7."))
    finally:
        node.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="2 restarts a side")
    args = parser.parse_args()
    rounds = 2 if args.quick else 5
    home = Path(tempfile.mkdtemp(prefix="bench-warm-"))
    log_dir = home / "logs"
    log_dir.mkdir()
    prompt_tokens = seed_shelf(home, log_dir)
    ttft: dict[str, list[float]] = {"cold": [], "warm": []}
    cached: dict[str, list[int]] = {"cold": [], "warm": []}
    for i in range(rounds):
        for warm in (True, False) if i % 2 else (False, True):
            side = "warm" if warm else "cold"
            seconds, reused = restarted_first_turn(home, log_dir, warm=warm, round_=i)
            ttft[side].append(seconds)
            cached[side].append(reused)
    cold, hot = statistics.median(ttft["cold"]), statistics.median(ttft["warm"])
    print(
        f"first turn after a restart ({prompt_tokens} prompt tokens): cold {cold:.3f} s, "
        f"warm {hot:.3f} s, {cold / hot:.1f}x; cached tokens cold {cached['cold']}, "
        f"warm {cached['warm']}"
    )
    emit(
        {
            "bench": "warm_start",
            "quick": args.quick,
            "prompt_tokens": prompt_tokens,
            "ttft_cold_s": round(cold, 3),
            "ttft_warm_s": round(hot, 3),
            "ratio": round(cold / hot, 2),
            "cached_tokens": cached,
        }
    )


if __name__ == "__main__":
    main()
