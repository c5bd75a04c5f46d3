"""The decode step at agent context lengths under llama.cpp's KV settings, in one run.

Agent sessions hold 1-2k tokens, where a CPU decode step spends its time reading the KV cache
(attention), not the weights. For each setting this fills ``--sequences`` sequences with
``--context`` tokens each, then times ``--steps`` decode steps of one token per sequence (the
batch a busy node decodes), and prints tokens/s. Settings: K/V cache type (f16, q8_0),
flash attention (on, off), unified KV buffer or one per sequence. The peer is
llama.cpp's own default (``DEFAULT``: f16 with flash attention, which its ``auto`` picks on
these CPUs); ``ratio`` is the
best setting's tokens/s over the default's. Settings alternate over ``--rounds`` rounds.

    python bench/kv_settings.py [--quick]
"""

from __future__ import annotations

import argparse
import time

from harness import bundled_model_path, emit

from inference.engine.llama import ContextShape, LlamaContext, LlamaModel

SETTINGS = {
    "f16 flash-on split": {"kv_type": "f16", "flash_attn": "on"},
    "f16 flash-off split": {"kv_type": "f16", "flash_attn": "off"},
    "q8_0 flash-on split": {"kv_type": "q8_0", "flash_attn": "on"},
    "f16 flash-off unified": {"kv_type": "f16", "flash_attn": "off", "kv_unified": True},
    "q8_0 flash-on unified": {"kv_type": "q8_0", "flash_attn": "on", "kv_unified": True},
}
# the peer: the node's default and llama.cpp's (flash attention on; docs/engine.md says why
# it stays on although "f16 flash-off split" decodes faster)
DEFAULT = "f16 flash-on split"


def rates(model: LlamaModel, settings: dict, args) -> tuple[float, float]:
    """(prefill tokens/s filling every sequence, decode tokens/s of the steps after it)."""
    shape = ContextShape(
        args.sequences, args.context + args.steps + 8, 512, args.threads, **settings
    )
    ctx = LlamaContext(model, shape)
    try:
        tokens = model.tokenize("The agent calls a tool and reads the JSON result. " * 400)
        filling = time.perf_counter()
        for seq in range(args.sequences):
            for start in range(0, args.context, 512):
                for pos in range(start, min(start + 512, args.context)):
                    ctx.batch.add(tokens[(pos + seq) % len(tokens)], pos, seq, False)
                ctx.decode()
                ctx.batch.clear()
        prefill = args.sequences * args.context / (time.perf_counter() - filling)
        begin = time.perf_counter()
        for step in range(args.steps):
            for seq in range(args.sequences):
                ctx.batch.add(tokens[step % len(tokens)], args.context + step, seq, True)
            ctx.decode()
            ctx.batch.clear()
        return prefill, args.sequences * args.steps / (time.perf_counter() - begin)
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
    parser.add_argument(
        "--only", default="", help="comma-separated setting names to run (the default always runs)"
    )
    args = parser.parse_args()
    if args.quick:
        args.sequences, args.rounds = 4, 1
    model = LlamaModel(str(bundled_model_path()))
    decode: dict[str, list[float]] = {name: [] for name in SETTINGS}
    prefill: dict[str, list[float]] = {name: [] for name in SETTINGS}
    names = [n for n in SETTINGS if not args.only or n in args.only.split(",") or n == DEFAULT]
    decode = {n: decode[n] for n in names}
    prefill = {n: prefill[n] for n in names}
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else reversed(names):
            filled, decoded = rates(model, SETTINGS[name], args)
            prefill[name].append(filled)
            decode[name].append(decoded)
    best = {name: round(max(values), 1) for name, values in decode.items()}
    best_prefill = {name: round(max(values), 1) for name, values in prefill.items()}
    for name, value in best.items():
        print(f"{name:32s} decode {value:8.1f} tok/s   prefill {best_prefill[name]:8.1f} tok/s")
    default = best[DEFAULT]
    winner = max(best, key=best.get)
    emit(
        {
            "bench": "kv_settings",
            "quick": args.quick,
            "sequences": args.sequences,
            "context": args.context,
            "threads": args.threads,
            "tokens_per_s": best,
            "prefill_tokens_per_s": best_prefill,
            "best": winner,
            "ratio": round(best[winner] / default, 3),
        }
    )


if __name__ == "__main__":
    main()
