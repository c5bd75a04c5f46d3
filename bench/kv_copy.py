"""What copying an idle session's KV out to host RAM and back costs, against prefilling it again.

Fills one sequence with ``--context`` tokens of an agent's history, then times (best of
``--repeats``): the copy out (``llama_state_seq_get_data``), the copy back
(``llama_state_seq_set_data``), cutting the state after a shared system prompt of ``--shared``
tokens and joining it back (``kv_blob``: what keeping a shared prefix once costs), and the
peer, prefilling the same tokens again. ``ratio`` = (copy out + split + join + copy back) /
prefill: how much of a re-prefill a round trip through host RAM costs.

    python bench/kv_copy.py [--context 1536] [--shared 600]
"""

from __future__ import annotations

import argparse
import time

from harness import bundled_model_path, emit

from inference.engine import kv_blob
from inference.engine.llama import ContextShape, LlamaContext, LlamaModel


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--context", type=int, default=1536)
    parser.add_argument("--shared", type=int, default=600)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    model = LlamaModel(str(bundled_model_path()))
    ctx = LlamaContext(model, ContextShape(2, args.context + 64, 512, args.threads))
    tokens = model.tokenize("The agent calls a tool and reads the JSON result. " * 400)
    tokens = tokens[: args.context]

    def prefill() -> None:
        ctx.seq_truncate(0, 0)
        for start in range(0, len(tokens), 512):
            for pos in range(start, min(start + 512, len(tokens))):
                ctx.batch.add(tokens[pos], pos, 0, False)
            ctx.decode()
            ctx.batch.clear()

    prefill_s = best_of(max(2, args.repeats // 2), prefill)
    blob = ctx.state_export(0)
    out_s = best_of(args.repeats, lambda: ctx.state_export(0))
    in_s = best_of(args.repeats, lambda: ctx.state_import(1, blob))
    split_s = best_of(args.repeats, lambda: kv_blob.split(blob, args.shared))
    prefix, own = kv_blob.split(blob, args.shared)
    join_s = best_of(args.repeats, lambda: kv_blob.join(prefix, own))
    ctx.close()
    model.close()
    mib = len(blob) / 2**20
    round_trip = out_s + split_s + join_s + in_s
    for name, seconds in [
        ("copy out", out_s),
        ("split", split_s),
        ("join", join_s),
        ("copy back", in_s),
        ("round trip", round_trip),
        ("prefill again (peer)", prefill_s),
    ]:
        print(f"{name:22s} {seconds * 1000:8.1f} ms  {mib / seconds:8.0f} MiB/s")
    print(f"state {mib:.1f} MiB for {args.context} tokens; own part {len(own) / 2**20:.1f} MiB")
    emit(
        {
            "bench": "kv_copy",
            "context": args.context,
            "state_mib": round(mib, 2),
            "own_mib": round(len(own) / 2**20, 2),
            "ms": {
                "copy_out": round(out_s * 1000, 2),
                "split": round(split_s * 1000, 2),
                "join": round(join_s * 1000, 2),
                "copy_back": round(in_s * 1000, 2),
                "prefill": round(prefill_s * 1000, 1),
            },
            "ratio": round(round_trip / prefill_s, 4),
        }
    )


if __name__ == "__main__":
    main()
