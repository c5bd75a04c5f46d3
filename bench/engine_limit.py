"""How close the engine's decode is to the memory-bandwidth limit, in one run.

The peer is the machine itself: decode of one sequence must read every weight once per token,
so its ceiling (the roofline) is the memory bandwidth measured here (``memory_bandwidth_gb_s``,
the figure device validation records: STREAM Copy's count, one core) over the model's weight
bytes (the GGUF file's size: weights plus a little metadata and vocabulary). An engine with the
bundled model (SmolLM2-135M-Instruct Q4_1; ``--quantization Q4_0``: that type built from it,
what the embedded array serves on AVX2), the node's defaults but 2 threads, is measured:

- ``roofline_fraction_1``: single-stream decode tokens/s (the engine's own ``decode_tokens_per_s``
  of a 128-token answer to a ~60-token prompt, median of ``--rounds``) over the roofline
  (goal >= 0.5, issue 34);
- ``batch_gain_8``: aggregate tokens/s of 8 concurrent streams (generated tokens over wall time
  from submit to the last end) over the same figure for one stream (goal >= 2.5);
  ``roofline_fraction_8``: decode steps/s at 8 streams (each step reads the weights once) over
  the roofline;
- ``long_context_ratio``: single-stream decode tokens/s after a ~1,500-token prompt over after
  a ~60-token one (goal >= 0.7);
- ``python_share``: of the engine's decode-step time over the whole run, the part outside
  llama.cpp's calls (``phalanx_node_step_*_seconds_total``).

    python bench/engine_limit.py [--quick] [--quantization Q4_0] [--repeatable]
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import time

from harness import emit, model_file

from inference.engine.config import EngineConfig
from inference.engine.prompt import ChatFormatter
from inference.engine.request import Failed, Finished, Request
from inference.engine.sampling import SamplingParams
from inference.engine.scheduler import Engine
from nodes.devices.bench import memory_bandwidth_gb_s

SHORT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
FILLER = (
    "The keeper logged the weather every hour: wind from the west, rain at dusk, the lamp "
    "trimmed and the lens polished, ships passing far out beyond the reef. "
)


def start_engine(path: str, *, repeatable: bool) -> Engine:
    engine = Engine(
        EngineConfig(
            model_path=path, sequences=8, ctx_per_seq=2048, threads=2, repeatable=repeatable
        )
    )
    engine.start()
    if not engine.ready.wait(180):
        raise RuntimeError(f"the engine did not load: {engine.load_error}")
    return engine


def run(engine: Engine, prompts: list[list[int]], max_tokens: int) -> tuple[list[Finished], float]:
    """Submit every prompt at once; their last events and the wall time to the last one."""
    sinks: list[queue.Queue] = [queue.Queue() for _ in prompts]
    requests = [
        Request(
            prompt=prompt,
            params=SamplingParams(temperature=0.0, max_tokens=max_tokens),
            sink=sink.put,
        )
        for prompt, sink in zip(prompts, sinks, strict=True)
    ]
    started = time.perf_counter()
    engine.submit_all(requests)
    done = [_last(sink) for sink in sinks]
    return done, time.perf_counter() - started


def _last(sink: queue.Queue) -> Finished:
    while True:
        event = sink.get(timeout=300)
        if isinstance(event, Failed):
            raise RuntimeError(event.message)
        if isinstance(event, Finished):
            return event


def measure(engine: Engine, rounds: int, max_tokens: int) -> dict:
    model = engine.model
    formatter = ChatFormatter(
        model.meta("tokenizer.chat_template"), bos_token=model.bos_token, eos_token=model.eos_token
    )

    def prompt(text: str, tag: str) -> list[int]:
        return model.tokenize(formatter.render([{"role": "user", "content": f"[{tag}] {text}"}]))

    long_text = FILLER * 42 + SHORT  # ~1,500 tokens
    single, single_agg, long, gains = [], [], [], []
    for r in range(rounds):
        (one,), wall = run(engine, [prompt(SHORT, f"one {r}")], max_tokens)
        single.append(one.timings["decode_tokens_per_s"])
        single_agg.append(one.completion_tokens / wall)
        (far,), _ = run(engine, [prompt(long_text, f"long {r}")], max_tokens)
        long.append(far.timings["decode_tokens_per_s"])
        eight, wall = run(engine, [prompt(SHORT, f"eight {r} {i}") for i in range(8)], max_tokens)
        gains.append(sum(f.completion_tokens for f in eight) / wall)
    return {
        "prompt_tokens_short": one.prompt_tokens,
        "prompt_tokens_long": far.prompt_tokens,
        "single_decode_tokens_per_s": statistics.median(single),
        "single_aggregate_tokens_per_s": statistics.median(single_agg),
        "eight_aggregate_tokens_per_s": statistics.median(gains),
        "long_decode_tokens_per_s": statistics.median(long),
        "spread_single": [min(single), max(single)],
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="2 rounds of 64 tokens")
    parser.add_argument(
        "--quantization",
        default="Q4_1",
        help="the bundled Q4_1, or another type built from it (Q4_0: what the embedded array "
        "serves on AVX2; harness.model_file)",
    )
    parser.add_argument(
        "--repeatable",
        action="store_true",
        help="the engine as runnode --repeatable starts it (flash attention on): what it costs",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    rounds, max_tokens = (2, 64) if args.quick else (5, 128)
    path = model_file(args.quantization)
    weights = os.path.getsize(path)
    bandwidth = memory_bandwidth_gb_s()
    roofline = bandwidth * 1e9 / weights  # tokens/s when a token costs one read of the weights
    engine = start_engine(str(path), repeatable=args.repeatable)
    try:
        run(engine, [engine.model.tokenize("Warm up.")], 8)
        loaded_with = engine.snapshot()["kv_settings"]
        figures = measure(engine, rounds, max_tokens)
        snapshot = engine.snapshot()
    finally:
        engine.stop()
    step_s = snapshot["step_seconds_total"]
    python_share = 1 - snapshot["step_llama_seconds_total"] / step_s if step_s else 0.0
    result = {
        "bench": "engine_limit",
        "quick": args.quick,
        "quantization": args.quantization.upper(),
        "repeatable": args.repeatable,
        "flash_attn": snapshot["kv_settings"]["flash_attn"],
        # the engine may move to other settings when idle between runs (retime.py): then the
        # figures mix both, and this says so
        "settings_moved": snapshot["kv_settings"] != loaded_with,
        "weights_bytes": weights,
        "bandwidth_gb_s": bandwidth,
        "roofline_tokens_per_s": round(roofline, 1),
        **{k: (round(v, 2) if isinstance(v, float) else v) for k, v in figures.items()},
        "roofline_fraction_1": round(figures["single_decode_tokens_per_s"] / roofline, 3),
        "roofline_fraction_8": round(figures["eight_aggregate_tokens_per_s"] / 8 / roofline, 3),
        "batch_gain_8": round(
            figures["eight_aggregate_tokens_per_s"] / figures["single_aggregate_tokens_per_s"], 2
        ),
        "long_context_ratio": round(
            figures["long_decode_tokens_per_s"] / figures["single_decode_tokens_per_s"], 3
        ),
        "python_share": round(python_share, 3),
    }
    print(
        f"roofline {result['roofline_tokens_per_s']} tok/s ({bandwidth} GB/s over "
        f"{weights / 1e6:.1f} MB); single {result['single_decode_tokens_per_s']} tok/s = "
        f"{result['roofline_fraction_1']} of it; 8 streams x{result['batch_gain_8']}; "
        f"1,500 vs 60 tokens of context {result['long_context_ratio']}; "
        f"Python {result['python_share']:.1%} of a step"
    )
    emit(result)


if __name__ == "__main__":
    main()
