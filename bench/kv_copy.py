"""What copying an idle session's KV out to host RAM and back costs, against prefilling it again.

Fills one sequence with ``--context`` tokens of an agent's history, then measures ``--repeats``
rounds. Each round times both sides once: the round trip (the copy out,
``llama_state_seq_get_data``; cutting the state after a shared system prompt of ``--shared``
tokens and joining it back, ``kv_blob``: what keeping a shared prefix once costs; the copy back,
``llama_state_seq_set_data``) and the peer, prefilling the same tokens again. Both sides get the
same number of repeats, and the side that goes first alternates from round to round, so drift on
a busy machine does not land on one side. Each figure is reported as min / median / max over
the rounds; ``ratio`` = median round trip / median prefill: how much of a re-prefill a round
trip through host RAM costs.

    python bench/kv_copy.py [--quick] [--context 1536] [--shared 600] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from harness import bundled_model_path, emit

from inference.engine import kv_blob
from inference.engine.llama import ContextShape, LlamaContext, LlamaModel

STEPS = ("copy_out", "split", "join", "copy_back")


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of ``fn`` took."""
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def spread(values: list[float]) -> dict:
    """min / median / max of ``values`` (seconds), in milliseconds."""
    return {
        "min": round(min(values) * 1000, 2),
        "median": round(statistics.median(values) * 1000, 2),
        "max": round(max(values) * 1000, 2),
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="3 rounds (about half a minute)")
    parser.add_argument("--context", type=int, default=1536)
    parser.add_argument("--shared", type=int, default=600)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="rounds, each timing both sides")
    args = parser.parse_args()
    if args.quick:
        args.repeats = 3
    return args


def measure(ctx: LlamaContext, tokens: list[int], args) -> tuple[dict[str, list[float]], bytes]:
    """Seconds per round of each step, the round trip and the prefill; and the state copied."""

    def prefill() -> None:
        ctx.seq_truncate(0, 0)
        for start in range(0, len(tokens), 512):
            for pos in range(start, min(start + 512, len(tokens))):
                ctx.batch.add(tokens[pos], pos, 0, False)
            ctx.decode()
            ctx.batch.clear()

    prefill()  # warm-up, and the state every round copies
    blob = ctx.state_export(0)
    prefix, own = kv_blob.split(blob, args.shared)
    steps = {
        "copy_out": lambda: ctx.state_export(0),
        "split": lambda: kv_blob.split(blob, args.shared),
        "join": lambda: kv_blob.join(prefix, own),
        "copy_back": lambda: ctx.state_import(1, blob),
    }
    times: dict[str, list[float]] = {name: [] for name in (*STEPS, "round_trip", "prefill")}
    for r in range(args.repeats):
        for side in ("round_trip", "prefill") if r % 2 == 0 else ("prefill", "round_trip"):
            if side == "prefill":
                times["prefill"].append(timed(prefill))
                continue
            for name in STEPS:
                times[name].append(timed(steps[name]))
            times["round_trip"].append(sum(times[name][-1] for name in STEPS))
    return times, blob


def main() -> None:
    args = parse_args()
    model = LlamaModel(str(bundled_model_path()))
    ctx = LlamaContext(model, ContextShape(2, args.context + 64, 512, args.threads))
    tokens = model.tokenize("The agent calls a tool and reads the JSON result. " * 400)
    times, blob = measure(ctx, tokens[: args.context], args)
    own = kv_blob.split(blob, args.shared)[1]
    ctx.close()
    model.close()
    mib = len(blob) / 2**20
    ms = {name: spread(values) for name, values in times.items()}
    for name, figures in ms.items():
        label = "prefill again (peer)" if name == "prefill" else name.replace("_", " ")
        rate = mib / (figures["median"] / 1000)
        print(
            f"{label:22s} {figures['min']:8.1f} / {figures['median']:8.1f} / "
            f"{figures['max']:8.1f} ms (min / median / max)  {rate:8.0f} MiB/s at the median"
        )
    print(f"state {mib:.1f} MiB for {args.context} tokens; own part {len(own) / 2**20:.1f} MiB")
    emit(
        {
            "bench": "kv_copy",
            "quick": args.quick,
            "context": args.context,
            "repeats": args.repeats,
            "state_mib": round(mib, 2),
            "own_mib": round(len(own) / 2**20, 2),
            "ms": ms,
            "ratio": round(ms["round_trip"]["median"] / ms["prefill"]["median"], 4),
        }
    )


if __name__ == "__main__":
    main()
