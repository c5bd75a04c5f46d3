"""Prompt-lookup drafting as users get it (``auto``) against none (``off``), in one run.

Three engines with the bundled model and the same settings but ``speculate``: ``auto`` (the
default: drafts only where the step cost measured at load says it pays, printed as
``draft_step_cost`` with the decision as ``auto_drafting``), ``off``, and ``on`` (drafting
forced, an extra figure). All three run for the whole benchmark and are measured one at a
time, the order rotating from round to round so each goes first in turn. Workloads, greedy, 64
tokens each: ``agent`` (the model repeats a tool call and a tool result it was given, as agents
echo names, arguments and results) and ``prose`` (a short poem: little to look up), at 1 and 8
concurrent requests. Prints decode tokens/s (generated tokens / wall time; the median of the
rounds, with min and max), generated token counts, the draft acceptance rate, and checks each
side's texts against ``off``'s. ``ratio`` = ``auto`` over ``off`` on agent output, one request;
``ratio_prose`` the same on prose, ``ratio_8`` / ``ratio_prose_8`` at 8 requests;
``forced_on_ratio`` (``on`` over ``off``, per workload) is what drafting would give if forced.

    python bench/speculation.py [--quick]
"""

from __future__ import annotations

import argparse
import queue
import statistics
import time

from harness import bundled_model_path, emit

from inference.engine.config import EngineConfig
from inference.engine.prompt import ChatFormatter
from inference.engine.request import Finished, Request
from inference.engine.sampling import SamplingParams
from inference.engine.scheduler import Engine

TOOL_RESULT = (
    '{"flights": [{"id": "TP1234", "from": "OSL", "to": "LIS", "departs": "08:15", '
    '"price_eur": 212}, {"id": "TP1236", "from": "OSL", "to": "LIS", "departs": "10:40", '
    '"price_eur": 189}]}'
)
WORKLOADS = {
    "agent": "Here is a tool result: {r}\nCopy the second flight's JSON object exactly.",
    "prose": "Write a short poem about the sea, number {i}.",
}


def start(speculate: str, threads: int) -> Engine:
    engine = Engine(
        EngineConfig(
            model_path=str(bundled_model_path()),
            sequences=8,
            ctx_per_seq=1024,
            threads=threads,
            speculate=speculate,
        )
    )
    engine.start()
    assert engine.ready.wait(120), engine.load_error
    return engine


def run(engine: Engine, workload: str, streams: int) -> tuple[float, list[str], int, int, int]:
    """(tokens/s, texts, drafted, accepted, generated tokens) of ``streams`` concurrent greedy
    requests."""
    model = engine.model
    fmt = ChatFormatter(
        model.meta("tokenizer.chat_template"), bos_token=model.bos_token, eos_token=model.eos_token
    )
    events: queue.Queue = queue.Queue()
    requests = []
    for i in range(streams):
        text = WORKLOADS[workload].format(r=TOOL_RESULT, i=i)
        prompt = model.tokenize(fmt.render([{"role": "user", "content": text}]))
        params = SamplingParams(max_tokens=64, temperature=0)
        requests.append(Request(prompt=prompt, params=params, sink=events.put))
    begin = time.perf_counter()
    engine.submit_all(requests)
    done: list[Finished] = []
    while len(done) < streams:
        event = events.get(timeout=300)
        if isinstance(event, Finished):
            done.append(event)
    wall = time.perf_counter() - begin
    tokens = sum(d.completion_tokens for d in done)
    texts = sorted(d.text for d in done)
    drafted = sum(d.timings["draft_tokens"] for d in done)
    accepted = sum(d.timings["draft_accepted"] for d in done)
    return tokens / wall, texts, drafted, accepted, tokens


SIDES = ("auto", "off", "on")  # "on" last: an extra figure, not the headline


def measure(engines: dict, workload: str, streams: int, rounds: int) -> dict:
    """One workload on every engine over ``rounds`` rounds (plus a warm-up round 0, which fills
    every side's prompt cache alike), each round's order rotated by one."""
    rates: dict[str, list[float]] = {name: [] for name in engines}
    texts: dict[str, list[str]] = {}
    tokens = dict.fromkeys(engines, 0)
    counts = {name: [0, 0] for name in engines}
    names = list(engines)
    for r in range(rounds + 1):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            rate, texts[name], drafted, accepted, generated = run(engines[name], workload, streams)
            if r:
                rates[name].append(rate)
                tokens[name] += generated
                counts[name][0] += drafted
                counts[name][1] += accepted
    return {
        name: {
            "tok_s": round(statistics.median(rates[name]), 1),
            "tok_s_min": round(min(rates[name]), 1),
            "tok_s_max": round(max(rates[name]), 1),
            "completion_tokens": tokens[name],
            "acceptance": round(counts[name][1] / counts[name][0], 3) if counts[name][0] else 0.0,
            "same_text_as_off": texts[name] == texts["off"],
        }
        for name in engines
    }


def ratio(results: dict, key: str, side: str) -> float:
    return round(results[key][side]["tok_s"] / results[key]["off"]["tok_s"], 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="one round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    engines = {name: start(name, args.threads) for name in SIDES}
    results: dict = {}
    try:
        for workload in WORKLOADS:
            for streams in (1, 8):
                results[f"{workload}_{streams}"] = measure(engines, workload, streams, rounds)
    finally:
        step_cost = round(engines["auto"].draft_step_cost, 2)
        auto_drafting = engines["auto"].drafting
        for engine in engines.values():
            engine.stop()
    for key, sides in results.items():
        for name, r in sides.items():
            print(
                f"{key:8s} {name:4s} {r['tok_s']:6.1f} tok/s ({r['tok_s_min']:.1f}-"
                f"{r['tok_s_max']:.1f})  {r['completion_tokens']:5d} tokens  acceptance "
                f"{r['acceptance']:.2f}  same text as off {r['same_text_as_off']}"
            )
    emit(
        {
            "bench": "speculation",
            "quick": args.quick,
            "rounds": rounds,
            "draft_step_cost": step_cost,
            "auto_drafting": auto_drafting,
            **results,
            "ratio": ratio(results, "agent_1", "auto"),
            "ratio_prose": ratio(results, "prose_1", "auto"),
            "ratio_8": ratio(results, "agent_8", "auto"),
            "ratio_prose_8": ratio(results, "prose_8", "auto"),
            "forced_on_ratio": {key: ratio(results, key, "on") for key in results},
        }
    )


if __name__ == "__main__":
    main()
