"""The decode step at agent context lengths under llama.cpp's KV settings, in one run.

Agent sessions hold 1-2k tokens, where a CPU decode step spends its time reading the KV cache
(attention), not the weights. Settings: K/V cache type (f16, q8_0), flash attention (on, off),
unified KV buffer or one per sequence. For each setting one context is made and its
``--sequences`` sequences filled with ``--context`` tokens each (the first prefilled, timed: the
prefill figure, one per setting; the others loaded from its state, so every sequence holds cells
of its own, as on a busy node). Then every setting, the default included, is measured in each of
``--rounds`` rounds, interleaved (the order reversed every other round, so drift on a busy
machine does not land on one setting): ``--steps`` decode steps of one token per sequence (the
batch a busy node decodes), whose cells are dropped again after the round.

The peer is llama.cpp's own default (``DEFAULT``: f16 with flash attention, which its ``auto``
picks on these CPUs). Each setting's decode tokens/s is reported as min / median / max over the
rounds; ``best`` is the setting with the highest median and ``ratio`` its median over the
default's median (a best-of-rounds pick would favour whichever setting had the luckiest round).

    python bench/kv_settings.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
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


def filled(model: LlamaModel, settings: dict, tokens: list[int], args) -> tuple:
    """(a context of ``settings`` whose sequences hold ``--context`` cells each, prefill
    tokens/s of the first sequence). The other sequences load the first one's state: cells of
    their own (a unified buffer too: no cells shared), without prefilling each."""
    shape = ContextShape(
        args.sequences, args.context + args.steps + 8, 512, args.threads, **settings
    )
    ctx = LlamaContext(model, shape)
    began = time.perf_counter()
    for start in range(0, args.context, 512):
        for pos in range(start, min(start + 512, args.context)):
            ctx.batch.add(tokens[pos % len(tokens)], pos, 0, False)
        ctx.decode()
        ctx.batch.clear()
    prefill = args.context / (time.perf_counter() - began)
    state = ctx.state_export(0)
    for seq in range(1, args.sequences):
        ctx.state_import(seq, state)
    decode_rate(ctx, tokens, args, steps=1)  # warm-up: the first step allocates its buffers
    return ctx, prefill


def decode_rate(ctx: LlamaContext, tokens: list[int], args, steps: int) -> float:
    """Tokens/s of ``steps`` decode steps of one token per sequence after ``--context`` cells;
    the cells they add are dropped afterwards, so every round starts from the same state."""
    began = time.perf_counter()
    for step in range(steps):
        for seq in range(args.sequences):
            ctx.batch.add(tokens[step % len(tokens)], args.context + step, seq, True)
        ctx.decode()
        ctx.batch.clear()
    rate = args.sequences * steps / (time.perf_counter() - began)
    for seq in range(args.sequences):
        ctx.seq_truncate(seq, args.context)
    return rate


def spread(values: list[float]) -> dict:
    return {
        "min": round(min(values), 1),
        "median": round(statistics.median(values), 1),
        "max": round(max(values), 1),
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="4 sequences, 3 rounds")
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--context", type=int, default=1536)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--only", default="", help="comma-separated setting names to run (the default always runs)"
    )
    args = parser.parse_args()
    if args.quick:
        args.sequences, args.rounds = 4, 3
    return args


def main() -> None:
    args = parse_args()
    model = LlamaModel(str(bundled_model_path()))
    tokens = model.tokenize("The agent calls a tool and reads the JSON result. " * 400)
    names = [n for n in SETTINGS if not args.only or n in args.only.split(",") or n == DEFAULT]
    contexts, prefill = {}, {}
    try:
        for name in names:
            contexts[name], prefill[name] = filled(model, SETTINGS[name], tokens, args)
        decode: dict[str, list[float]] = {name: [] for name in names}
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else reversed(names):
                decode[name].append(decode_rate(contexts[name], tokens, args, args.steps))
    finally:
        for ctx in contexts.values():
            ctx.close()
    figures = {name: spread(values) for name, values in decode.items()}
    for name, f in figures.items():
        print(
            f"{name:24s} decode {f['min']:6.1f} / {f['median']:6.1f} / {f['max']:6.1f} tok/s"
            f" (min / median / max of {args.rounds})   prefill {prefill[name]:6.1f} tok/s"
        )
    winner = max(figures, key=lambda name: figures[name]["median"])
    emit(
        {
            "bench": "kv_settings",
            "quick": args.quick,
            "sequences": args.sequences,
            "context": args.context,
            "threads": args.threads,
            "rounds": args.rounds,
            "tokens_per_s": figures,
            "prefill_tokens_per_s": {name: round(v, 1) for name, v in prefill.items()},
            "best": winner,
            "ratio": round(figures[winner]["median"] / figures[DEFAULT]["median"], 3),
        }
    )


if __name__ == "__main__":
    main()
