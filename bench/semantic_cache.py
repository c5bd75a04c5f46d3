"""What the semantic cache saves and what it costs (issue 32).

1. **Replay** (``agent_traffic.traffic``: sessions of one question and two tool calls that
   repeat with natural variation) through the cache as the array uses it
   (``SemanticCache`` with the default rules, tool calls in their canonical form as
   ``/v1/cache/tools`` writes them), once on the embedded store and once on Redis: the share
   of model calls and tool calls avoided (hits / requests; the peer is the same traffic
   without a cache, where every request is a call), and false hits (a hit stored for another
   intent).
2. **Labelled near-misses**: every near-miss pair of ``labelled_pairs.yaml`` and the held-out
   set, one side stored, the other looked up: each hit is a false hit (goal 0).
3. **A miss's added latency**: the lookup that misses, P50, per store (goal < 5 ms embedded,
   < 10 ms Redis), and end to end through a real array (a node with the bundled model, a
   control plane, a control loop): TTFT of requests that opt in and miss (every question is
   new) against requests that bypass the cache, alternating, one at a time; once with the
   embedded store and once with a control plane on ``REDIS_URL`` (database 13, emptied after).

    python bench/semantic_cache.py [--quick]     # --quick: under 3 minutes

Ends with one JSON line: ``avoided_share``, ``false_hits`` (replay + labelled, both stores),
``miss_overhead_ms_p50`` (end to end, embedded), ``miss_overhead_ms_p50_redis``, and the details.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
import django  # noqa: E402

django.setup()

from agent_traffic import traffic  # noqa: E402
from control_plane import ControlPlane  # noqa: E402
from harness import emit, percentile, start_node, stream_chat  # noqa: E402

from inference.semcache.cache import Hit, Rules, SemanticCache, tool_text  # noqa: E402
from inference.semcache.encoder import DIMENSIONS, shared_encoder  # noqa: E402
from inference.semcache.guard import tool_call  # noqa: E402
from inference.semcache.precision import PAIRS, labelled_pairs  # noqa: E402
from inference.semcache.service import DEFAULT_MAX_ENTRIES, DEFAULT_THRESHOLD, DEFAULT_TTL_S  # noqa: E402
from inference.semcache.store import Entry, SqliteStore  # noqa: E402

RULES = Rules(DEFAULT_THRESHOLD, DEFAULT_TTL_S, DEFAULT_MAX_ENTRIES)
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
# the end-to-end run's control plane: a database of its own, emptied after the run
E2E_REDIS_URL = os.environ.get("BENCH_E2E_REDIS_URL", "redis://127.0.0.1:6379/13")


def _stores(home: Path) -> dict:
    from inference.semcache.redis_store import RedisStore

    return {
        "embedded": lambda: SqliteStore(home / f"semcache-{uuid.uuid4().hex[:6]}.sqlite3"),
        "redis": lambda: RedisStore(REDIS_URL, prefix=f"phalanx-bench:{uuid.uuid4().hex[:8]}:"),
    }


def _drop(store) -> None:
    if hasattr(store, "redis"):
        keys = list(store.redis.scan_iter(f"{store.prefix}*"))
        if keys:
            store.redis.delete(*keys)


def _canonical(text: str) -> str:
    call = tool_call(text)
    return tool_text(*call) if call else text


def replay(cache: SemanticCache, requests) -> dict:
    """Hits, false hits and miss lookup times of ``requests`` through ``cache``."""
    intents: dict[int, str] = {}
    counts = {"answer": [0, 0], "tool": [0, 0]}  # requests, hits
    false_hits, miss_ms = [], []
    for request in requests:
        text = _canonical(request.text)
        started = time.perf_counter()
        found = cache.lookup(request.namespace, "", text, RULES)
        elapsed = (time.perf_counter() - started) * 1000
        counts[request.kind][0] += 1
        if isinstance(found, Hit):
            counts[request.kind][1] += 1
            if intents[found.entry.id] != request.intent:
                false_hits.append((request.text, found.entry.text))
            continue
        miss_ms.append(elapsed)
        entry = Entry(request.namespace, "", "", text, '"answer"', 0.0, 0.0)
        intents[cache.put(entry, RULES, found.vector).id] = request.intent
    return {"counts": counts, "false_hits": false_hits, "miss_ms": miss_ms}


def labelled(cache: SemanticCache) -> list[tuple[str, str]]:
    """Near-misses of both labelled sets that the cache served."""
    pairs = labelled_pairs() + labelled_pairs(PAIRS.with_name("labelled_pairs_holdout.yaml"))
    served = []
    for n, pair in enumerate(p for p in pairs if not p.same):
        namespace = f"{pair.namespace}:labelled-{n}"
        cache.put(Entry(namespace, "", "", _canonical(pair.a), '"x"', 0.0, 0.0), RULES)
        if isinstance(cache.lookup(namespace, "", _canonical(pair.b), RULES), Hit):
            served.append((pair.a, pair.b))
    return served


def in_process(sessions: int) -> dict:
    from django.conf import settings

    embed = shared_encoder(settings.MODEL_DIR / "embeddings").embed
    embed(["warm up"])
    home = Path(tempfile.mkdtemp(prefix="bench-semcache-"))
    out = {}
    for name, make in _stores(home).items():
        store = make()
        try:
            cache = SemanticCache(store, embed, DIMENSIONS)
            result = replay(cache, traffic(sessions))
            result["labelled_false_hits"] = labelled(SemanticCache(store, embed, DIMENSIONS))
        finally:
            _drop(store)
        out[name] = result
    return out


async def end_to_end(plane: ControlPlane, requests: int) -> dict[str, list[float]]:
    """TTFT (ms) of new questions that opt in (and miss) against ones that bypass."""
    ttft: dict[str, list[float]] = {"use": [], "bypass": []}
    async with httpx.AsyncClient(timeout=120) as client:
        for i in range(requests + 2):  # two warm-up rounds
            for choice in ("use", "bypass") if i % 2 else ("bypass", "use"):
                question = f"Question {uuid.uuid4().hex[:8]}: name a colour that starts with {chr(65 + i % 26)}."
                body = {
                    "model": "smollm2-135m-instruct-q4_1",
                    "messages": [{"role": "user", "content": question}],
                    "max_tokens": 8,
                    "temperature": 0,
                }
                headers = {**plane.headers, "X-Phalanx-Cache": choice}
                result = await stream_chat(client, plane.url, body, headers=headers)
                if i >= 2 and result.tokens:
                    ttft[choice].append(result.ttft_s * 1000)
    return ttft


def through_array(requests: int) -> dict[str, dict[str, list[float]]]:
    """``end_to_end`` on one node, through a control plane with the embedded store, then
    through one with ``REDIS_URL`` (its own database, ``E2E_REDIS_URL``, emptied after)."""
    log_dir = Path(tempfile.mkdtemp(prefix="bench-semcache-array-"))
    node = start_node(
        "node-cache", log_dir, extra_args=["--sequences", "2", "--ctx-per-seq", "1024"]
    )
    out = {}
    try:
        for name, env in (("embedded", {}), ("redis", {"REDIS_URL": E2E_REDIS_URL})):
            plane = ControlPlane(
                {"node-cache": node.url.removeprefix("http://")},
                _made(log_dir / name),
                policy={"health_interval_s": 2.0, "canary_idle_s": 0},
                env={"PHALANX_SHIP_LOGS": "0", **env},
            )
            try:
                out[name] = asyncio.run(end_to_end(plane, requests))
            finally:
                plane.stop()
    finally:
        node.stop()
        _empty(E2E_REDIS_URL)
    return out


def _made(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _empty(url: str) -> None:
    """Remove what the Redis-backed control plane stored in the bench's database."""
    import redis

    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter("*"))
    if keys:
        client.delete(*keys)


def _share(result: dict) -> float:
    total = sum(n for n, _ in result["counts"].values())
    return sum(h for _, h in result["counts"].values()) / max(1, total)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="150 sessions, 20 requests a side")
    args = parser.parse_args()
    sessions, requests = (150, 20) if args.quick else (600, 60)
    stores = in_process(sessions)
    runs = through_array(requests)
    added = {n: percentile(t["use"], 50) - percentile(t["bypass"], 50) for n, t in runs.items()}
    for name, result in stores.items():
        counts = result["counts"]
        print(
            f"{name}: avoided {_share(result):.1%} of {sum(n for n, _ in counts.values())} calls "
            f"(model calls {counts['answer'][1]}/{counts['answer'][0]}, tool calls "
            f"{counts['tool'][1]}/{counts['tool'][0]}); false hits {len(result['false_hits'])} "
            f"replayed, {len(result['labelled_false_hits'])} labelled; miss lookup P50 "
            f"{percentile(result['miss_ms'], 50):.2f} ms"
        )
        for query, served in (result["false_hits"] + result["labelled_false_hits"])[:5]:
            print(f"  FALSE HIT: {query!r} served {served!r}")
    for name, run in runs.items():
        print(
            f"end to end, {name}: TTFT P50 bypass {percentile(run['bypass'], 50):.2f} ms, "
            f"opted in and missing {percentile(run['use'], 50):.2f} ms (+{added[name]:.2f} ms)"
        )
    embedded = stores["embedded"]
    emit(
        {
            "bench": "semantic_cache",
            "quick": args.quick,
            "sessions": sessions,
            "avoided_share": round(_share(embedded), 4),
            "avoided_share_redis": round(_share(stores["redis"]), 4),
            "model_calls": embedded["counts"]["answer"],
            "tool_calls": embedded["counts"]["tool"],
            "false_hits": sum(
                len(r["false_hits"]) + len(r["labelled_false_hits"]) for r in stores.values()
            ),
            "miss_overhead_ms_p50": round(added["embedded"], 2),
            "miss_overhead_ms_p50_redis": round(added["redis"], 2),
            "miss_lookup_ms_p50": {
                n: round(percentile(r["miss_ms"], 50), 2) for n, r in stores.items()
            },
            "ttft_ms_p50": {
                name: {k: round(percentile(v, 50), 2) for k, v in run.items()}
                for name, run in runs.items()
            },
        }
    )


if __name__ == "__main__":
    main()
