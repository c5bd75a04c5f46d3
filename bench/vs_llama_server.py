"""One Phalanx node against llama.cpp's own ``llama-server``: same model, threads and sequences.

The peer is built once from the llama.cpp sources vendored in llama-cpp-python's source
distribution (the version Phalanx runs), fetched from the package registry into a cache
directory outside the repository (``--cache``, default ``~/.cache/phalanx-bench``); nothing of it
is committed. Both servers run for the whole benchmark:

* ``llama-server -t T -tb T -np S -c S*C`` (its defaults otherwise: its 8 GiB host-memory prompt
  cache, slots chosen by longest common prefix), and
* ``manage.py runnode --threads T --sequences S --ctx-per-seq C`` (its defaults otherwise).

Workloads, each run on both sides, the first side alternating from one workload to the next:

* plain streams: ``--streams`` concurrent requests (default 1, 8 and 16; issue 34 asks for
  1,4,8,16,32), each its own prompt, greedy, 64 tokens; aggregate completion tokens per second
  and TTFT P95, ``--rounds`` times (default 3) with other prompts each round, the first side
  alternating; the median of the rounds is reported, with the spread of the per-round ratios;
* agent sessions: a ~530-token system prompt listing tools, each turn adds a user message
  (~55 tokens) or a tool result (~95 tokens) and generates up to 40 tokens (greedy),
  ``X-Session-Id`` set, streamed. 8 sessions x 10 turns, and 24 sessions x 6 turns, 8 turns in
  flight at once (so with 24 sessions each sequence is shared by three sessions taking turns).
  The assistant turns put back into the history are scripted (``multiturn.scripted_reply``,
  whatever either model generated), so both sides are sent the same histories (``history``).

Fair to the peer: the same prompts and histories on both sides, token counts reported as each
server counted them (prompt, reused from its cache, prefilled, generated), and per-token figures
beside the per-turn ones, measured by this client the same way on both sides: TTFT per prefilled
prompt token and the time after the first token per further generated token. A side that
generates fewer tokens (an earlier end of text) then finishes its turns sooner without being
faster per token.

Prints each figure side by side, then one JSON line with ``ratio_8`` and ``ratio_24`` (Phalanx's
mean turn over llama-server's; goals <= 0.8 and <= 0.6), ``per_token_ratio`` (the same for the
per-token figures), ``tps_ratio`` per stream count (goal >= 1.1 at 16 and 32, issue 34) and
``streams`` (per level: both sides' tok/s and TTFT P95, the spread). ``--quantization Q4_0``
runs both sides on that type built from the bundled file (what the embedded array serves on
AVX2: docs/packages.md, "The serving type").

    python bench/vs_llama_server.py [--quick] [--build-only] [--streams 1,4,8,16,32]
        [--rounds 3] [--quantization Q4_0] [--only streams]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import httpx
from harness import (
    emit,
    free_port,
    model_file,
    percentile,
    spawn,
    start_node,
    stream_chat,
    wait_until_up,
)
from multiturn import SYSTEM, scripted_reply

LLAMA_CPP_PYTHON = "0.3.36"  # pyproject.toml pins the same version
NO_KEEPALIVE = httpx.Limits(max_keepalive_connections=0)


def cpu_flags() -> list[str]:
    """The CMake flags this Python's llama-cpp-python was built with (the record ``make install``
    leaves in the venv: x86-64-v3 plus the AVX-512 sets the CPU lists), so that both sides run
    the same kernels. Raises ``SystemExit`` for a Python that ``make install`` did not set up."""
    record = Path(sys.prefix) / ".llama-cmake-args"
    if not record.exists():
        raise SystemExit(f"{record} is missing: run the benchmark with the venv make install made")
    return record.read_text().split()


def ensure_llama_server(cache: Path) -> Path:
    """The ``llama-server`` binary, built on first use (minutes) from the vendored sources."""
    root = cache / f"llama-cpp-python-{LLAMA_CPP_PYTHON}"
    flags = cpu_flags()  # one build a set of flags (an older native build is not reused)
    build = root / ("build-" + hashlib.sha256(" ".join(flags).encode()).hexdigest()[:8])
    binary = build / "bin" / "llama-server"
    if binary.exists():
        return binary
    root.mkdir(parents=True, exist_ok=True)
    sdist = root / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    if not sdist.exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", f"llama-cpp-python=={LLAMA_CPP_PYTHON}"]
            + ["--no-binary", ":all:", "--no-deps", "--quiet", "-d", str(root)],
            check=True,
        )
    sources = root / "src"
    if not sources.exists():
        with tarfile.open(sdist) as archive:
            archive.extractall(root / "unpack", filter="data")
        (root / "unpack" / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp").rename(
            sources
        )
        shutil.rmtree(root / "unpack")
    # the same sources with the same CPU flags as the Makefile builds llama-cpp-python with
    # (never GGML_NATIVE: a native build dies of SIGILL on AMX tiles here)
    subprocess.run(
        ["cmake", "-S", str(sources), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release"]
        + ["-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF"]
        + ["-DLLAMA_BUILD_EXAMPLES=OFF", *flags],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    subprocess.run(
        ["cmake", "--build", str(build), "--target", "llama-server"]
        + ["-j", str(os.cpu_count() or 2)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return binary


def start_llama_server(binary: Path, log_dir: Path, args) -> object:
    port = free_port()
    proc = spawn(
        [str(binary), "-m", str(args.model), "--host", "127.0.0.1", "--port", str(port)]
        + ["-t", str(args.threads), "-tb", str(args.threads), "-np", str(args.sequences)]
        + ["-c", str(args.sequences * args.ctx_per_seq), "--no-webui"],
        log_dir / "llama-server.log",
    )
    proc.url = f"http://127.0.0.1:{port}"
    return wait_until_up(proc, "/health", "llama-server", timeout=120)


def system_prompt(tag: str) -> str:
    """About 560 tokens: an agent's instructions and four of ``multiturn``'s tool schemas (all
    six make 780, and ten turns would not fit a 2,048-token sequence)."""
    return f"[{tag}] " + "\n".join(SYSTEM.splitlines()[:6])


def turn_message(session: int, turn: int) -> dict:
    """A tool result (odd turns, about 100 tokens) or a user request (even turns, about 55)."""
    if turn % 2:
        results = [
            {"id": f"R{session}-{turn}-{k}", "price": 100 + 7 * k + turn, "city": "Lisbon"}
            | {"status": "confirmed", "note": "window seat, breakfast included"}
            for k in range(2)
        ]
        return {"role": "user", "content": "Tool result: " + json.dumps({"results": results})}
    return {
        "role": "user",
        "content": (
            f"Session {session}, step {turn}: I travel from Oslo to Lisbon next week with my "
            "family of four; we prefer morning flights and a hotel near the old town with "
            "breakfast. Check the weather there and convert 500 euros to kroner, thanks."
        ),
    }


def history(tag: str, session: int, turn: int) -> list[dict]:
    """The messages sent for ``session``'s turn ``turn``: the system prompt, each earlier turn's
    message and its scripted reply, then this turn's message. The same on both sides whatever
    either model generated; each turn's history extends the previous one's."""
    messages = [{"role": "system", "content": system_prompt(tag)}]
    for earlier in range(turn):
        messages.append(turn_message(session, earlier))
        messages.append({"role": "assistant", "content": scripted_reply(session, earlier)})
    return [*messages, turn_message(session, turn)]


def prompt_counts(result) -> tuple[int, int | None]:
    """(prompt tokens, of them reused from the server's cache) as the server counted them:
    ``usage`` and its ``prompt_tokens_details.cached_tokens``, else llama-server's ``timings``
    (``cache_n`` reused, ``prompt_n`` evaluated); reused is None where neither says."""
    usage, timings = result.usage or {}, result.timings or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is None:
        cached = timings.get("cache_n")
    prompt = usage.get("prompt_tokens")
    if prompt is None:
        prompt = timings.get("prompt_n", 0) + (cached or 0)
    return prompt, cached


def turn_record(result, turn_s: float, turn: int) -> dict:
    """One turn's figures: seconds, TTFT, and the server's token counts."""
    prompt, cached = prompt_counts(result)
    completion = (result.usage or {}).get("completion_tokens", result.tokens)
    return {
        "turn_s": turn_s,
        "ttft_s": result.ttft_s if result.tokens else None,  # no text streamed: no first token
        "later": turn > 0,
        "prompt": prompt,
        "cached": cached,
        "completion": completion,
    }


async def agent_sessions(
    url: str, headers: dict, tag: str, sessions: int, turns: int, at_once: int
) -> dict:
    """``sessions`` conversations of ``turns`` turns, at most ``at_once`` turns in flight; the
    waiting turns are served first come, first served, so sessions take turns round-robin.
    Returns ``{"turns": [turn_record, ...], "wall_s": seconds}``."""
    gate = asyncio.Semaphore(at_once)
    out: dict = {"turns": []}

    async def one(client: httpx.AsyncClient, sid: int) -> None:
        for turn in range(turns):
            body = {"messages": history(tag, sid, turn), "max_tokens": 40, "temperature": 0}
            body["stream_options"] = {"include_usage": True}
            async with gate:
                began = time.perf_counter()
                result = await stream_chat(
                    client, url, body, headers={**headers, "X-Session-Id": f"{tag}-{sid}"}
                )
                turn_s = time.perf_counter() - began
            out["turns"].append(turn_record(result, turn_s, turn))

    # a new connection per request on both sides: llama-server's HTTP library closes idle
    # keep-alive connections after 5 s, and a request sent on one it just closed fails
    async with httpx.AsyncClient(timeout=1200, limits=NO_KEEPALIVE) as client:
        began = time.perf_counter()
        await asyncio.gather(*(one(client, s) for s in range(sessions)))
        out["wall_s"] = time.perf_counter() - began
    return out


async def plain_streams(url: str, headers: dict, tag: str, streams: int, max_tokens: int) -> dict:
    """``streams`` concurrent one-turn chats, each with its own prompt; aggregate tokens/s."""

    async def one(client: httpx.AsyncClient, i: int):
        body = {
            "messages": [{"role": "user", "content": f"[{tag}-{i}] Write a story about a fox."}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream_options": {"include_usage": True},
        }
        return await stream_chat(client, url, body, headers=headers)

    async with httpx.AsyncClient(timeout=600, limits=NO_KEEPALIVE) as client:
        began = time.perf_counter()
        results = await asyncio.gather(*(one(client, i) for i in range(streams)))
        wall = time.perf_counter() - began
    tokens = sum((r.usage or {}).get("completion_tokens", r.tokens) for r in results)
    ttfts = [r.ttft_s for r in results if r.tokens]
    return {
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "ttft_p95_s": percentile(ttfts, 95),
    }


def agent_figures(out: dict) -> dict:
    """Per-turn figures (mean and p95 turn, TTFT of later turns), the token counts, and the
    per-token figures: TTFT ms per prefilled prompt token (None when the server did not say
    what it reused) and ms per generated token after the first."""
    records = out["turns"]
    turns = [r["turn_s"] for r in records]
    ttft_later = [r["ttft_s"] for r in records if r["later"] and r["ttft_s"] is not None]
    streamed = [r for r in records if r["ttft_s"] is not None]
    known = all(r["cached"] is not None for r in records)
    prefilled = sum(r["prompt"] - r["cached"] for r in streamed) if known else None
    after_first = sum(r["turn_s"] - r["ttft_s"] for r in streamed)
    further = sum(max(0, r["completion"] - 1) for r in streamed)
    ttft_sum = sum(r["ttft_s"] for r in streamed)
    return {
        "turns": len(records),
        "mean_turn_s": round(sum(turns) / len(turns), 3),
        "p95_turn_s": round(percentile(turns, 95), 3),
        "ttft_later_mean_s": round(sum(ttft_later) / max(1, len(ttft_later)), 3),
        "ttft_later_p95_s": round(percentile(ttft_later, 95), 3),
        "prompt_tokens": sum(r["prompt"] for r in records),
        "cached_tokens": sum(r["cached"] for r in records) if known else None,
        "prefilled_tokens": prefilled,
        "completion_tokens": sum(r["completion"] for r in records),
        "ttft_ms_per_prefilled_token": round(1000 * ttft_sum / prefilled, 3) if prefilled else None,
        "ms_per_generated_token": round(1000 * after_first / further, 3) if further else None,
        "wall_s": round(out["wall_s"], 1),
    }


def node_metrics(url: str, headers: dict) -> dict:
    """The node's own counters (where the time went): restores, skips, reuse, host RAM."""
    text = httpx.get(f"{url}/metrics", headers=headers, timeout=10).text
    wanted = (
        "restored_from_host_total",
        "restores_skipped_total",
        "reused_token_ratio",
        "host_ram_bytes",
        "host_ram_shared_saved_bytes",
        "host_prefixes",
        "sequences_host",
    )
    figures = {}
    for line in text.splitlines():
        for name in wanted:
            if line.split("{")[0].split(" ")[0] == f"phalanx_node_{name}":
                figures[name] = float(line.split()[-1])
    return figures


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer turns (about 8 minutes)")
    parser.add_argument("--build-only", action="store_true", help="build llama-server and stop")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "phalanx-bench")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--ctx-per-seq", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=None, help="which side goes first")
    parser.add_argument(
        "--only", default="", help="comma-separated workloads: streams,agents8,agents24"
    )
    parser.add_argument("--node-args", default="", help="extra runnode options, space-separated")
    parser.add_argument(
        "--streams",
        default="1,8,16",
        help="comma-separated plain-stream concurrencies (issue 34: 1,4,8,16,32)",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of each stream level, first side alternating"
    )
    parser.add_argument(
        "--quantization",
        default="Q4_1",
        help="the bundled Q4_1 or another type built from it (harness.model_file), both sides",
    )
    args = parser.parse_args()
    args.streams = [int(n) for n in args.streams.split(",") if n.strip()]
    args.model = model_file(args.quantization)
    return args


def workload_list(args: argparse.Namespace) -> list[tuple[str, object]]:
    """``(kind, size)`` in the order run: stream counts, then (sessions, turns) of agents."""
    turns8, turns24 = (4, 3) if args.quick else (10, 6)
    workloads: list[tuple[str, object]] = [("streams", n) for n in args.streams]
    workloads += [("agents8", (8, turns8)), ("agents24", (24, turns24))]
    if args.only:
        workloads = [w for w in workloads if w[0] in args.only.split(",")]
    return workloads


def run_workloads(servers: dict, sides: list[str], workloads: list, seed: int, rounds: int) -> dict:
    """Each workload on both servers (``{side: (url, headers)}``), the first side alternating
    from one run to the next; plain streams ``rounds`` times each (their figures are lists, one
    per round, other prompts each round). ``{side: {figure name: figures}}``."""
    results: dict[str, dict] = {side: {} for side in sides}
    turn = 0
    for kind, size in workloads:
        for r in range(rounds if kind == "streams" else 1):
            for side in sides if turn % 2 == 0 else sides[::-1]:
                url, headers = servers[side]
                tag = f"{kind}-{size}-{seed}-{r}"  # the same prompts on both sides
                if kind == "streams":
                    got = asyncio.run(plain_streams(url, headers, tag, size, 64))
                    figures = {k: round(v, 3) for k, v in got.items()}
                    results[side].setdefault(f"streams_{size}", []).append(figures)
                else:
                    sessions, turns = size
                    got = asyncio.run(agent_sessions(url, headers, tag, sessions, turns, 8))
                    figures = results[side][kind] = agent_figures(got)
                print(side, kind, size, r, json.dumps(figures), flush=True)
            turn += 1
    return results


def main() -> None:
    args = parse_args()
    binary = ensure_llama_server(args.cache)
    if args.build_only:
        print(binary)
        return
    seed = args.seed if args.seed is not None else random.randrange(1 << 16)
    print(f"seed {seed}")
    sides = ["llama-server", "phalanx"]
    random.Random(seed).shuffle(sides)
    log_dir = Path(tempfile.mkdtemp(prefix="phalanx-vs-llama-server-"))
    theirs = start_llama_server(binary, log_dir, args)
    ours = start_node(
        "bench-node",
        log_dir,
        threads=args.threads,
        extra_args=["--sequences", str(args.sequences), "--ctx-per-seq", str(args.ctx_per_seq)]
        + ["--model", str(args.model)]
        + args.node_args.split(),
    )
    try:
        servers = {"llama-server": (theirs.url, {}), "phalanx": (ours.url, ours.headers)}
        results = run_workloads(servers, sides, workload_list(args), seed, args.rounds)
        node = node_metrics(ours.url, ours.headers)
    finally:
        ours.stop()
        theirs.stop()
    report(results, node, args, seed)


def ratio_of(ours: float | None, theirs: float | None, digits: int = 3) -> float | None:
    """``ours / theirs``, or None where either is missing or the peer's is 0."""
    if ours is None or not theirs:
        return None
    return round(ours / theirs, digits)


def print_side_by_side(label: str, theirs, ours) -> None:
    ratio = ratio_of(ours, theirs, 2) if not isinstance(ours, bool) else None
    shown = "" if ratio is None else f"{ratio:8.2f}"
    print(f"{label:40s} {theirs!s:>14} {ours!s:>14} {shown}")


PER_TOKEN = ("ttft_ms_per_prefilled_token", "ms_per_generated_token")


def stream_levels(ours: dict, theirs: dict, levels: list[int]) -> dict:
    """Per stream level: both sides' median aggregate tok/s and TTFT P95 over the rounds, the
    ratio of the medians, and the spread of the per-round ratios."""
    out = {}
    for n in levels:
        key = f"streams_{n}"
        if key not in ours:
            continue
        mine, peer = ours[key], theirs[key]
        per_round = [
            ratio_of(a["tokens_per_s"], b["tokens_per_s"]) for a, b in zip(mine, peer, strict=True)
        ]
        out[n] = {
            "phalanx_tokens_per_s": statistics.median(r["tokens_per_s"] for r in mine),
            "llama_server_tokens_per_s": statistics.median(r["tokens_per_s"] for r in peer),
            "phalanx_ttft_p95_s": statistics.median(r["ttft_p95_s"] for r in mine),
            "llama_server_ttft_p95_s": statistics.median(r["ttft_p95_s"] for r in peer),
            "ratio_spread": [min(per_round), max(per_round)],
        }
        out[n]["tps_ratio"] = ratio_of(
            out[n]["phalanx_tokens_per_s"], out[n]["llama_server_tokens_per_s"]
        )
        out[n]["ttft_p95_ratio"] = ratio_of(
            out[n]["phalanx_ttft_p95_s"], out[n]["llama_server_ttft_p95_s"]
        )
    return out


def report(results: dict, node: dict, args, seed: int) -> None:
    ours, theirs = results["phalanx"], results["llama-server"]
    print(f"\n{'figure':40s} {'llama-server':>14s} {'phalanx':>14s} {'ratio':>8s}")
    levels = stream_levels(ours, theirs, args.streams)
    for n, level in levels.items():
        a, b = level["llama_server_tokens_per_s"], level["phalanx_tokens_per_s"]
        print_side_by_side(f"{n} plain streams, tok/s (median)", round(a, 1), round(b, 1))
        a, b = level["llama_server_ttft_p95_s"], level["phalanx_ttft_p95_s"]
        print_side_by_side(f"{n} plain streams, TTFT P95 s", round(a, 3), round(b, 3))
        print(f"{'':40s} ratio per round {level['ratio_spread']}")
    tps_ratio = {n: level["tps_ratio"] for n, level in levels.items()}
    ratios, per_token = {}, {}
    for kind in ("agents8", "agents24"):
        if kind not in ours:
            continue
        for figure in ours[kind]:
            print_side_by_side(f"{kind} {figure}", theirs[kind][figure], ours[kind][figure])
        ratios[kind] = ratio_of(ours[kind]["mean_turn_s"], theirs[kind]["mean_turn_s"])
        per_token[kind] = {f: ratio_of(ours[kind][f], theirs[kind][f]) for f in PER_TOKEN}
        if ours[kind]["prompt_tokens"] != theirs[kind]["prompt_tokens"]:
            print(f"{kind}: the two chat templates render the same histories to other lengths")
    print("node counters after the run:", json.dumps(node))
    emit(
        {
            "bench": "vs_llama_server",
            "quick": args.quick,
            "seed": seed,
            "threads": args.threads,
            "sequences": args.sequences,
            "ctx_per_seq": args.ctx_per_seq,
            "quantization": args.quantization.upper(),
            "rounds": args.rounds,
            "ratio_8": ratios.get("agents8"),
            "ratio_24": ratios.get("agents24"),
            "per_token_ratio": per_token,
            "tps_ratio": tps_ratio,
            "streams": levels,
            "results": results,
            "node": node,
        }
    )


if __name__ == "__main__":
    main()
