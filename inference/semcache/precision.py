"""How precise a semantic-cache hit is, measured on our labelled pairs
(``labelled_pairs.yaml``: paraphrases that should hit, near-misses that must not).

For each namespace, ``operating_point`` picks the lowest similarity threshold (never below
``SIMILARITY_FLOOR``) at which the
hits served (similarity at least the threshold, and, with the guard, ``guard.disagreement``
empty) are at least ``TARGET_PRECISION`` paraphrases, and reports the hit rate on the
paraphrases and the false-hit rate on the near-misses with a 95 % Wilson interval. The same
with the threshold alone shows why a hit needs the second check. No Django here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from inference.semcache.guard import compared_text, disagreement

PAIRS = Path(__file__).with_name("labelled_pairs.yaml")
TARGET_PRECISION = 0.99
# no threshold below this, whatever the set allows: the set holds near-misses, not unrelated
# requests, and two unrelated requests with nothing for the check to compare can meet lower
SIMILARITY_FLOOR = 0.75
KINDS = ("paraphrase", "entity", "number", "date", "negation", "antonym", "unit")


@dataclass(frozen=True)
class Pair:
    a: str
    b: str
    same: bool
    kind: str
    namespace: str


def labelled_pairs(path: Path = PAIRS) -> list[Pair]:
    """The labelled set (``ValueError`` for an item that is not a pair)."""
    pairs = []
    for i, item in enumerate(yaml.safe_load(path.read_text())):
        pair = Pair(**item)
        if pair.kind not in KINDS or pair.same != (pair.kind == "paraphrase"):
            raise ValueError(f"pair {i}: kind {pair.kind!r} with same={pair.same}")
        pairs.append(pair)
    return pairs


def wilson(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval of a proportion (Wilson, 1927)."""
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    half /= 1 + z * z / trials
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class OperatingPoint:
    """One namespace's threshold and what it gives on the labelled set."""

    namespace: str
    guarded: bool
    threshold: float
    precision: float
    hit_rate: float  # paraphrases served
    false_hits: int  # near-misses served
    near_misses: int
    false_hit_interval: tuple[float, float]  # 95 % Wilson interval of the false-hit rate
    paraphrases: int

    def as_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def scored(pairs: list[Pair], embed) -> list[tuple[Pair, float, bool]]:
    """(pair, cosine similarity, guard passes) for each pair; ``embed`` gives unit vectors
    of the texts as the cache compares them (``guard.compared_text``)."""
    vectors = embed([compared_text(p.a) for p in pairs] + [compared_text(p.b) for p in pairs])
    left, right = vectors[: len(pairs)], vectors[len(pairs) :]
    sims = np.einsum("ij,ij->i", left, right)
    return [(p, float(s), not disagreement(p.a, p.b)) for p, s in zip(pairs, sims, strict=True)]


def operating_point(
    rows: list[tuple[Pair, float, bool]], namespace: str, *, guarded: bool = True
) -> OperatingPoint:
    """The lowest threshold reaching ``TARGET_PRECISION`` on ``namespace``'s pairs."""
    mine = [r for r in rows if r[0].namespace == namespace]
    same = sum(1 for p, _, _ in mine if p.same)
    near = len(mine) - same
    candidates = {round(s, 4) for _, s, _ in mine if s >= SIMILARITY_FLOOR}
    for threshold in sorted(candidates | {SIMILARITY_FLOOR, 1.0}):
        served = [p for p, s, ok in mine if s >= threshold and (ok or not guarded)]
        hits = sum(1 for p in served if p.same)
        false = len(served) - hits
        precision = hits / len(served) if served else 1.0
        if precision >= TARGET_PRECISION:
            return OperatingPoint(
                namespace, guarded, threshold, precision, hits / max(1, same), false, near,
                wilson(false, near), same,
            )  # fmt: skip
    raise AssertionError("unreachable: a threshold of 1.0 serves nothing")
