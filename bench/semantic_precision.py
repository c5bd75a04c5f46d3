"""How precise a semantic hit is and what deciding one costs (the semantic cache's footing).

On our labelled pairs (``inference/semcache/labelled_pairs.yaml``), per namespace, the lowest
similarity threshold that serves at least 99 % paraphrases, with the second check
(``guard.disagreement``) and with the threshold alone (the peer: what a cache without the
check must do); then those thresholds applied unchanged to the held-out pairs
(``labelled_pairs_holdout.yaml``, written blind to the check). And the time one query's
decision takes on one core: embedding it (all-MiniLM-L6-v2 on onnxruntime) plus the check.
One JSON line: ``ratio`` = guarded / threshold-alone hit rate (answers), ``false_hits``
(both sets, guarded), ``decide_ms_p50``.

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
    emit(result)


if __name__ == "__main__":
    main()
