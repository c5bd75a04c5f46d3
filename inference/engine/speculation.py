"""Speculative decoding by prompt lookup: draft tokens from n-grams already in the context.

Agent output repeats its context: tool-call JSON echoes names and arguments from the tool
list, answers quote tool results. ``draft_tokens`` finds the latest earlier occurrence of the
context's last few tokens and proposes the tokens that followed it; the engine decodes the
draft in the same batch as the request's next token and keeps the drafted tokens the model
itself would have chosen, so greedy output is the same as without drafting and every accepted
token saves a decode step. Method: A. Saxena, "Prompt Lookup Decoding" (2023,
github.com/apoorvumang/prompt-lookup-decoding); llama.cpp's ``lookup`` example does the same
with an n-gram cache.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_NGRAM = 4  # the longest suffix looked up first: a longer match predicts better
MIN_NGRAM = 2  # one token alone matches too often to predict anything
MAX_DRAFT = 6  # tokens proposed per step


def draft_tokens(
    context: Sequence[int],
    *,
    max_ngram: int = MAX_NGRAM,
    min_ngram: int = MIN_NGRAM,
    max_draft: int = MAX_DRAFT,
) -> list[int]:
    """Up to ``max_draft`` tokens that followed the latest earlier occurrence of the last
    ``n`` tokens of ``context`` (``n`` from ``max_ngram`` down to ``min_ngram``); [] when no
    suffix recurs. Pure; O(len(context)) per ``n``."""
    size = len(context)
    for n in range(min(max_ngram, size - 1), min_ngram - 1, -1):
        tail = list(context[size - n :])
        first = tail[0]
        # the latest earlier start i < size - n with context[i:i+n] == tail
        for i in range(size - n - 1, -1, -1):
            if context[i] == first and list(context[i : i + n]) == tail:
                follow = list(context[i + n : i + n + max_draft])
                if follow:
                    return follow
                break
    return []


def draft_pays(*, produced: int, steps: int, draft_len: int, step_cost: float) -> bool:
    """Whether a request should draft ``draft_len`` tokens this step.

    ``step_cost`` is the measured cost of decoding ``1 + MAX_DRAFT`` tokens of one sequence
    relative to one token (``Engine`` measures it at load); a draft of ``d`` tokens is taken to
    cost ``1 + (step_cost - 1) * d / MAX_DRAFT`` steps (linear between the two measurements).
    ``produced / steps`` is what the request's drafted steps have yielded so far (tokens per
    step, 1 + accepted). Its first two drafts are always tried (a probe); after that it drafts
    while the yield beats the cost."""
    if steps < 2:
        return True
    cost = 1.0 + (step_cost - 1.0) * draft_len / MAX_DRAFT
    return produced / steps > cost
