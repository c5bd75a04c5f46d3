"""Prompt-lookup drafting on and off, same engine settings, in one run.

Two engines with the bundled model (``speculate`` "on" and "off"; "auto", the default,
drafts only where the step cost measured at load says it pays, printed as ``draft_step_cost``), measured one at a time,
alternating which goes first. Workloads, greedy, 64 tokens each: ``agent`` (the model repeats
a tool call and a tool result it was given, as agents echo names, arguments and results) and
``prose`` (a short poem: little to look up), at 1 and 8 concurrent requests. Prints decode
tokens/s (generated tokens / wall time), the draft acceptance rate, and checks the texts are
the same. ``ratio`` = agent tokens/s with drafting / without, one request.

    python bench/speculation.py [--quick]
"""

from __future__ import annotations

import argparse
import queue
import time

from harness import bundled_model_path, emit

from inference.engine.prompt import ChatFormatter
from inference.engine.sampling import SamplingParams
from inference.engine.scheduler import Engine, EngineConfig, Finished, Request

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


def run(engine: Engine, workload: str, streams: int) -> tuple[float, list[str], int, int]:
    """(tokens/s, texts, drafted, accepted) of ``streams`` concurrent greedy requests."""
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
    return tokens / wall, texts, drafted, accepted


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="one round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    sides = {"drafting": start("on", args.threads), "plain": start("off", args.threads)}
    results: dict = {}
    try:
        for workload in WORKLOADS:
            for streams in (1, 8):
                key = f"{workload}_{streams}"
                rates: dict[str, list[float]] = {name: [] for name in sides}
                texts: dict[str, list[str]] = {}
                counts = (0, 0)
                for r in range(rounds + 1):  # round 0 warms the prompt cache of both sides
                    order = list(sides) if r % 2 == 0 else list(reversed(sides))
                    for name in order:
                        rate, texts[name], drafted, accepted = run(sides[name], workload, streams)
                        if r:
                            rates[name].append(rate)
                        if name == "drafting" and r:
                            counts = (counts[0] + drafted, counts[1] + accepted)
                results[key] = {
                    "drafting_tok_s": round(max(rates["drafting"]), 1),
                    "plain_tok_s": round(max(rates["plain"]), 1),
                    "acceptance": round(counts[1] / counts[0], 3) if counts[0] else 0.0,
                    "same_text": texts["drafting"] == texts["plain"],
                }
    finally:
        step_cost = round(sides["drafting"].draft_step_cost, 2)
        for engine in sides.values():
            engine.stop()
    for key, r in results.items():
        print(
            f"{key:8s} drafting {r['drafting_tok_s']:6.1f} tok/s  plain {r['plain_tok_s']:6.1f}"
            f" tok/s  acceptance {r['acceptance']:.2f}  same text {r['same_text']}"
        )
    emit(
        {
            "bench": "speculation",
            "quick": args.quick,
            "draft_step_cost": step_cost,
            **results,
            "ratio": round(
                results["agent_1"]["drafting_tok_s"] / results["agent_1"]["plain_tok_s"], 2
            ),
            "ratio_8": round(
                results["agent_8"]["drafting_tok_s"] / results["agent_8"]["plain_tok_s"], 2
            ),
        }
    )


if __name__ == "__main__":
    main()
