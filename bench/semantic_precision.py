"""How precise a semantic hit is and what deciding one costs (the semantic cache's footing).

On our labelled pairs (``inference/semcache/labelled_pairs.yaml``), per namespace, the lowest
similarity threshold that serves at least 99 % paraphrases, with the second check
(``guard.disagreement``) and with the threshold alone (the peer: what a cache without the
check must do); then those thresholds applied unchanged to the held-out pairs
(``labelled_pairs_holdout.yaml``, written blind to the check). And the time one query's
decision takes on one core: embedding it (all-MiniLM-L6-v2 on onnxruntime) plus the check.
The second peer is the bundled chat model's own embeddings (SmolLM2-135M, mean-pooled), the
same pairs and the same method: ``separation_auc`` is the chance a paraphrase scores above a
near-miss. One JSON line: ``ratio`` = guarded / threshold-alone hit rate (answers),
``false_hits`` (both sets, guarded), ``decide_ms_p50``, ``chat_model``.

    python bench/semantic_precision.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from harness import emit  # noqa: E402

from inference.semcache.encoder import shared_encoder  # noqa: E402
from inference.semcache.guard import disagreement  # noqa: E402
from inference.semcache.precision import (  # noqa: E402
    PAIRS,
    Pair,
    labelled_pairs,
    operating_point,
    scored,
    wilson,
)

HOLDOUT = PAIRS.with_name("labelled_pairs_holdout.yaml")


def applied(rows, namespace: str, threshold: float) -> dict:
    """What ``threshold`` with the check serves of ``rows``' ``namespace``."""
    mine = [r for r in rows if r[0].namespace == namespace]
    served = [p for p, s, ok in mine if s >= threshold and ok]
    same = sum(p.same for p, _, _ in mine)
    near = len(mine) - same
    false = sum(not p.same for p in served)
    low, high = wilson(false, near)
    return {
        "hit_rate": round(sum(p.same for p in served) / max(1, same), 4),
        "false_hits": false,
        "near_misses": near,
        "false_hit_interval": [round(low, 4), round(high, 4)],
    }


def chat_model_embed():
    """The bundled chat model's (SmolLM2-135M-Instruct Q4_1) mean-pooled, L2-normalised
    embeddings: the peer the issue asks about (a chat model's hidden states, not a model
    trained for sentence similarity)."""
    import numpy as np
    from llama_cpp import LLAMA_POOLING_TYPE_MEAN, Llama

    from inference.bundled import ensure_bundled_model

    llm = Llama(
        model_path=str(ensure_bundled_model(settings.MODEL_DIR)),
        embedding=True,
        pooling_type=LLAMA_POOLING_TYPE_MEAN,
        n_ctx=512,
        n_threads=2,
        verbose=False,
    )

    def embed(texts: list[str]):
        vectors = np.array([llm.embed(text) for text in texts], dtype=np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    return embed


def separation(rows, namespace: str) -> float:
    """ROC AUC of similarity alone: the chance a paraphrase scores above a near-miss."""
    mine = [r for r in rows if r[0].namespace == namespace]
    same = [s for p, s, _ in mine if p.same]
    near = [s for p, s, _ in mine if not p.same]
    wins = sum((a > b) + 0.5 * (a == b) for a in same for b in near)
    return wins / max(1, len(same) * len(near))


def unrelated_served(pairs, embed, threshold: float, count: int = 400) -> float:
    """Share of unrelated requests (one pair's ``a`` against another pair's ``b``, same
    namespace, seeded) that ``threshold`` and the check would serve: each one a false hit the
    labelled near-misses cannot show."""
    import random

    rng = random.Random(3)
    served = 0
    for _ in range(count):
        first, second = rng.sample(pairs, 2)
        while second.namespace != first.namespace:
            second = rng.choice(pairs)
        [(_, score, agrees)] = scored(
            [Pair(first.a, second.b, False, "unrelated", first.namespace)], embed
        )
        served += score >= threshold and agrees
    return served / count


def chat_model_peer(pairs) -> dict:
    """The operating points and separation with the chat model's pooled embeddings."""
    embed = chat_model_embed()
    rows = scored(pairs, embed)
    out = {"unrelated_served": round(unrelated_served(pairs, embed, 0.75), 4)}
    print(
        f"chat model's pooled embeddings: {out['unrelated_served']:.0%} of unrelated requests served at 0.75"
    )
    for namespace in ("answers", "tools"):
        guarded = operating_point(rows, namespace)
        alone = operating_point(rows, namespace, guarded=False)
        out[namespace] = {
            "guarded": guarded.as_dict(),
            "threshold_alone": alone.as_dict(),
            "separation_auc": round(separation(rows, namespace), 4),
        }
        print(
            f"chat model's pooled embeddings, {namespace}: paraphrase above near-miss "
            f"{out[namespace]['separation_auc']:.0%} of the time; at 99 % precision "
            f"{guarded.hit_rate:.0%} with the check (threshold {guarded.threshold:.3f}), "
            f"{alone.hit_rate:.0%} alone"
        )
    return out


def decide_ms(encoder, pairs, repeats: int) -> float:
    """Median milliseconds to embed one query and check it against one candidate."""
    times = []
    for i in range(repeats):
        pair = pairs[i % len(pairs)]
        began = time.perf_counter()
        encoder.embed([pair.b])
        disagreement(pair.a, pair.b)
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer timing repeats")
    args = parser.parse_args()
    encoder = shared_encoder(settings.MODEL_DIR / "embeddings")
    pairs = labelled_pairs()
    rows = scored(pairs, encoder.embed)
    held = scored(labelled_pairs(HOLDOUT), encoder.embed) if HOLDOUT.exists() else []
    result: dict = {"bench": "semantic_precision", "quick": args.quick, "namespaces": {}}
    for namespace in ("answers", "tools"):
        guarded = operating_point(rows, namespace)
        alone = operating_point(rows, namespace, guarded=False)
        result["namespaces"][namespace] = {
            "guarded": guarded.as_dict(),
            "threshold_alone": alone.as_dict(),
            "holdout": applied(held, namespace, guarded.threshold) if held else None,
            "separation_auc": round(separation(rows, namespace), 4),
        }
        print(
            f"{namespace}: threshold {guarded.threshold:.3f} with the check serves "
            f"{guarded.hit_rate:.0%} of paraphrases, {guarded.false_hits}/{guarded.near_misses} "
            f"near-misses; the threshold alone ({alone.threshold:.3f}) {alone.hit_rate:.0%}"
        )
    answers = result["namespaces"]["answers"]
    result["ratio"] = round(
        answers["guarded"]["hit_rate"] / max(1e-9, answers["threshold_alone"]["hit_rate"]), 2
    ) if answers["threshold_alone"]["hit_rate"] else None  # fmt: skip
    result["false_hits"] = sum(
        v["guarded"]["false_hits"] + ((v["holdout"] or {}).get("false_hits") or 0)
        for v in result["namespaces"].values()
    )
    result["decide_ms_p50"] = round(decide_ms(encoder, pairs, 100 if args.quick else 500), 2)
    result["unrelated_served"] = round(unrelated_served(pairs, encoder.embed, 0.75), 4)
    print(
        f"all-MiniLM-L6-v2: {result['unrelated_served']:.0%} of unrelated requests served at 0.75"
    )
    result["chat_model"] = chat_model_peer(pairs)
    emit(result)


if __name__ == "__main__":
    main()
