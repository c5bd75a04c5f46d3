"""One Phalanx node against llama.cpp's own ``llama-server``: same model, threads and sequences.

The peer is built once from the llama.cpp sources vendored in llama-cpp-python's source
distribution (the version Phalanx runs), fetched from the package registry into a cache
directory outside the repository (``--cache``, default ``~/.cache/phalanx-bench``); nothing of it
is committed. Both servers run for the whole benchmark:

* ``llama-server -t T -tb T -np S -c S*C`` (its defaults otherwise: its 8 GiB host-memory prompt
  cache, slots chosen by longest common prefix), and
* ``manage.py runnode --threads T --sequences S --ctx-per-seq C`` (its defaults otherwise).

Workloads, each run on both sides, the first side alternating from one workload to the next:

* plain streams: 1, 8 and 16 concurrent requests, each its own prompt, greedy, 64 tokens;
  aggregate completion tokens per second;
* agent sessions: a ~530-token system prompt listing tools, each turn adds a user message
  (~55 tokens) or a tool result (~95 tokens) and generates up to 40 tokens (greedy; the text generated goes back
  into the history, as an agent's client does), ``X-Session-Id`` set, streamed. 8 sessions x 10
  turns, and 24 sessions x 6 turns, 8 turns in flight at once (so with 24 sessions each
  sequence is shared by three sessions taking turns).

Prints each figure side by side, then one JSON line with ``ratio_8`` and ``ratio_24`` (Phalanx's
mean turn over llama-server's; goals <= 0.8 and <= 0.6) and ``tps_ratio`` per stream count
(goal >= 1.1 at 8 and 16).

    python bench/vs_llama_server.py [--quick] [--build-only]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import httpx
from harness import (
    bundled_model_path,
    emit,
    free_port,
    percentile,
    spawn,
    start_node,
    stream_chat,
    wait_until_up,
)
from multiturn import SYSTEM

LLAMA_CPP_PYTHON = "0.3.36"  # pyproject.toml pins the same version
NO_KEEPALIVE = httpx.Limits(max_keepalive_connections=0)


def ensure_llama_server(cache: Path) -> Path:
    """The ``llama-server`` binary, built on first use (minutes) from the vendored sources."""
    root = cache / f"llama-cpp-python-{LLAMA_CPP_PYTHON}"
    binary = root / "build" / "bin" / "llama-server"
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
    # llama-cpp-python builds the same sources with llama.cpp's defaults (native CPU flags)
    subprocess.run(
        ["cmake", "-S", str(sources), "-B", str(root / "build"), "-DCMAKE_BUILD_TYPE=Release"]
        + ["-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF"]
        + ["-DLLAMA_BUILD_EXAMPLES=OFF"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    subprocess.run(
        ["cmake", "--build", str(root / "build"), "--target", "llama-server"]
        + ["-j", str(os.cpu_count() or 2)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return binary


def start_llama_server(binary: Path, log_dir: Path, args) -> object:
    port = free_port()
    proc = spawn(
        [str(binary), "-m", str(bundled_model_path()), "--host", "127.0.0.1", "--port", str(port)]
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


async def agent_sessions(
    url: str, headers: dict, tag: str, sessions: int, turns: int, at_once: int
) -> dict:
    """``sessions`` conversations of ``turns`` turns, at most ``at_once`` turns in flight; the
    waiting turns are served first come, first served, so sessions take turns round-robin."""
    gate = asyncio.Semaphore(at_once)
    out = {"turns": [], "ttft_later": [], "prompt": 0, "cached": 0, "completion": 0}

    async def one(client: httpx.AsyncClient, sid: int) -> None:
        messages = [{"role": "system", "content": system_prompt(tag)}]
        for turn in range(turns):
            messages.append(turn_message(sid, turn))
            body = {"messages": messages, "max_tokens": 40, "temperature": 0}
            body["stream_options"] = {"include_usage": True}
            async with gate:
                began = time.perf_counter()
                result = await stream_chat(
                    client, url, body, headers={**headers, "X-Session-Id": f"{tag}-{sid}"}
                )
                out["turns"].append(time.perf_counter() - began)
            if turn and result.tokens:  # a turn that streamed no text has no first token
                out["ttft_later"].append(result.ttft_s)
            usage = result.usage or {}
            out["prompt"] += usage.get("prompt_tokens", 0)
            out["completion"] += usage.get("completion_tokens", result.tokens)
            out["cached"] += (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            messages.append({"role": "assistant", "content": result.text})

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
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall}


def agent_figures(out: dict) -> dict:
    turns = out["turns"]
    return {
        "mean_turn_s": round(sum(turns) / len(turns), 3),
        "p95_turn_s": round(percentile(turns, 95), 3),
        "ttft_later_mean_s": round(sum(out["ttft_later"]) / max(1, len(out["ttft_later"])), 3),
        "ttft_later_p95_s": round(percentile(out["ttft_later"], 95), 3),
        "prompt_tokens": out["prompt"],
        "cached_tokens": out["cached"],
        "completion_tokens": out["completion"],
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


def main() -> None:
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
    args = parser.parse_args()
    binary = ensure_llama_server(args.cache)
    if args.build_only:
        print(binary)
        return
    seed = args.seed if args.seed is not None else random.randrange(1 << 16)
    print(f"seed {seed}")
    sides = ["llama-server", "phalanx"]
    random.Random(seed).shuffle(sides)
    turns8, turns24 = (4, 3) if args.quick else (10, 6)
    workloads = [("streams", n) for n in (1, 8, 16)]
    workloads += [("agents8", (8, turns8)), ("agents24", (24, turns24))]
    if args.only:
        workloads = [w for w in workloads if w[0] in args.only.split(",")]
    log_dir = Path(tempfile.mkdtemp(prefix="phalanx-vs-llama-server-"))
    theirs = start_llama_server(binary, log_dir, args)
    ours = start_node(
        "bench-node",
        log_dir,
        threads=args.threads,
        extra_args=["--sequences", str(args.sequences), "--ctx-per-seq", str(args.ctx_per_seq)]
        + args.node_args.split(),
    )
    results: dict[str, dict] = {side: {} for side in sides}
    try:
        for i, (kind, size) in enumerate(workloads):
            order = sides if i % 2 == 0 else sides[::-1]
            for side in order:
                url, headers = (
                    (theirs.url, {}) if side == "llama-server" else (ours.url, ours.headers)
                )
                tag = f"{kind}-{size}-{seed}"  # the same prompts on both sides
                if kind == "streams":
                    got = asyncio.run(plain_streams(url, headers, tag, size, 64))
                    results[side][f"streams_{size}"] = {k: round(v, 2) for k, v in got.items()}
                else:
                    sessions, turns = size
                    got = asyncio.run(agent_sessions(url, headers, tag, sessions, turns, 8))
                    results[side][kind] = agent_figures(got)
                print(side, kind, size, json.dumps(results[side].get(kind) or got), flush=True)
        node = node_metrics(ours.url, ours.headers)
    finally:
        ours.stop()
        theirs.stop()
    report(results, node, args, seed)


def report(results: dict, node: dict, args, seed: int) -> None:
    ours, theirs = results["phalanx"], results["llama-server"]
    print(f"\n{'figure':40s} {'llama-server':>14s} {'phalanx':>14s} {'ratio':>8s}")
    tps_ratio = {}
    for n in (1, 8, 16):
        key = f"streams_{n}"
        if key in ours:
            a, b = theirs[key]["tokens_per_s"], ours[key]["tokens_per_s"]
            tps_ratio[n] = round(b / a, 3)
            print(f"{f'{n} plain streams, tok/s':40s} {a:14.1f} {b:14.1f} {b / a:8.2f}")
    ratios = {}
    for kind in ("agents8", "agents24"):
        if kind not in ours:
            continue
        for figure in ours[kind]:
            a, b = theirs[kind][figure], ours[kind][figure]
            ratio = f"{b / a:8.2f}" if a else ""
            print(f"{f'{kind} {figure}':40s} {a:14} {b:14} {ratio}")
        ratios[kind] = round(ours[kind]["mean_turn_s"] / theirs[kind]["mean_turn_s"], 3)
    print("node counters after the run:", json.dumps(node))
    emit(
        {
            "bench": "vs_llama_server",
            "quick": args.quick,
            "seed": seed,
            "threads": args.threads,
            "sequences": args.sequences,
            "ctx_per_seq": args.ctx_per_seq,
            "ratio_8": ratios.get("agents8"),
            "ratio_24": ratios.get("agents24"),
            "tps_ratio": tps_ratio,
            "results": results,
            "node": node,
        }
    )


if __name__ == "__main__":
    main()
