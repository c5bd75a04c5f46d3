"""The leading tokens two token lists share: the measure prefix reuse (``sequences``), the
host-RAM store's shared prefixes (``host_store``) and admission (``scheduler``) are built on."""

from __future__ import annotations


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """Number of leading tokens ``a`` and ``b`` share.

    Binary search over slice comparisons (done in C), O(n log n) element compares at worst but
    far faster than a Python loop for the thousands-of-tokens prompts of agent sessions.
    """
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo
