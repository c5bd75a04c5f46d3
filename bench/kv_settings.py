"""The decode step at agent context lengths under llama.cpp's KV settings, in one run.

Agent sessions hold 1-2k tokens, where a CPU decode step spends its time reading the KV cache
(attention), not the weights. For each setting this fills ``--sequences`` sequences with
``--context`` tokens each, then times ``--steps`` decode steps of one token per sequence (the
batch a busy node decodes), and prints tokens/s. Settings: K/V cache type (f16, q8_0),
flash attention (on, off), unified KV buffer or one per sequence. The peer is the node's
default (f16, flash attention auto, one buffer per sequence at this length); ``ratio`` is the
best setting's tokens/s over the default's. Settings alternate over ``--rounds`` rounds.

    python bench/kv_settings.py [--quick]
"""

from __future__ import annotations

import argparse
import time

from harness import bundled_model_path, emit

from inference.engine.llama import ContextShape, LlamaContext, LlamaModel

SETTINGS = {
    "default f16 flash-auto split": {"kv_type": "f16", "flash_attn": "auto"},
    "f16 flash-off split": {"kv_type": "f16", "flash_attn": "off"},
    "q8_0 flash-on split": {"kv_type": "q8_0", "flash_attn": "on"},
    "f16 flash-auto unified": {"kv_type": "f16", "flash_attn": "auto", "kv_unified": True},
    "q8_0 flash-on unified": {"kv_type": "q8_0", "flash_attn": "on", "kv_unified": True},
}


def decode_rate(model: LlamaModel, settings: dict, args) -> float:
    """Tokens/s of decode steps (one token per sequence) after filling every sequence."""
    shape = ContextShape(
        args.sequences, args.context + args.steps + 8, 512, args.threads, **settings
    )
    ctx = LlamaContext(model, shape)
    try:
        tokens = model.tokenize("The agent calls a tool and reads the JSON result. " * 400)
        for seq in range(args.sequences):
            for start in range(0, args.context, 512):
                for pos in range(start, min(start + 512, args.context)):
                    ctx.batch.add(tokens[(pos + seq) % len(tokens)], pos, seq, False)
                ctx.decode()
                ctx.batch.clear()
        begin = time.perf_counter()
        for step in range(args.steps):
            for seq in range(args.sequences):
                ctx.batch.add(tokens[step % len(tokens)], args.context + step, seq, True)
            ctx.decode()
            ctx.batch.clear()
        return args.sequences * args.steps / (time.perf_counter() - begin)
    finally:
        ctx.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="4 sequences, one round")
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--context", type=int, default=1536)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.quick:
        args.sequences, args.rounds = 4, 1
    model = LlamaModel(str(bundled_model_path()))
    rates: dict[str, list[float]] = {name: [] for name in SETTINGS}
    names = list(SETTINGS)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else reversed(names):
            rates[name].append(decode_rate(model, SETTINGS[name], args))
    best = {name: round(max(values), 1) for name, values in rates.items()}
    for name, value in best.items():
        print(f"{name:32s} {value:8.1f} tok/s")
    default = best["default f16 flash-auto split"]
    winner = max(best, key=best.get)
    emit(
        {
            "bench": "kv_settings",
            "quick": args.quick,
            "sequences": args.sequences,
            "context": args.context,
            "threads": args.threads,
            "tokens_per_s": best,
            "best": winner,
            "ratio": round(best[winner] / default, 3),
        }
    )


if __name__ == "__main__":
    main()
