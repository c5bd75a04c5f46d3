"""Precision first (inference/semcache/precision.py): on our labelled pairs, the operating point
of each namespace serves no near-miss, and only the second check makes a useful hit rate
possible at 99 % precision (a threshold alone cannot separate a request from its reversal)."""

from __future__ import annotations

import pytest
from django.conf import settings

from inference.semcache.encoder import shared_encoder
from inference.semcache.precision import (
    PAIRS,
    TARGET_PRECISION,
    labelled_pairs,
    operating_point,
    scored,
    wilson,
)


@pytest.fixture(scope="module")
def rows():
    return scored(labelled_pairs(), shared_encoder(settings.MODEL_DIR / "embeddings").embed)


def test_the_set_is_ours_and_large_enough() -> None:
    pairs = labelled_pairs()
    near = [p for p in pairs if not p.same]
    assert len(pairs) >= 200 and len(near) >= 100
    assert {p.kind for p in near} == {"entity", "number", "date", "negation", "antonym", "unit"}


@pytest.mark.parametrize("namespace", ["answers", "tools"])
def test_near_misses_never_hit_and_paraphrases_mostly_do(rows, namespace) -> None:
    point = operating_point(rows, namespace)
    assert point.false_hits == 0 and point.precision >= TARGET_PRECISION
    assert point.hit_rate >= 0.8
    alone = operating_point(rows, namespace, guarded=False)
    assert alone.hit_rate < point.hit_rate / 2  # a threshold alone serves far fewer


def test_a_reversal_scores_above_the_threshold_a_paraphrase_needs(rows) -> None:
    by_text = {(p.a, p.b): s for p, s, _ in rows}
    reversal = by_text[("Turn on the living room lights.", "Turn off the living room lights.")]
    assert reversal > operating_point(rows, "answers").threshold


def test_the_wilson_interval_of_no_false_hit_in_99_is_under_4_percent() -> None:
    low, high = wilson(0, 99)
    assert low == 0.0 and 0.037 < high < 0.038


def test_the_held_out_pairs_written_blind_to_the_check_get_no_false_hit(rows) -> None:
    held = scored(
        labelled_pairs(PAIRS.with_name("labelled_pairs_holdout.yaml")),
        shared_encoder(settings.MODEL_DIR / "embeddings").embed,
    )
    for namespace in ("answers", "tools"):
        threshold = operating_point(rows, namespace).threshold
        served = [p for p, s, ok in held if p.namespace == namespace and s >= threshold and ok]
        assert all(p.same for p in served), [p for p in served if not p.same]
        assert sum(p.same for p in served) >= 0.7 * sum(
            p.same for p, _, _ in held if p.namespace == namespace
        )
