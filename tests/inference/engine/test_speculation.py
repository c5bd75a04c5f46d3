"""Prompt-lookup drafting (pure)."""

from __future__ import annotations

from inference.engine.speculation import draft_tokens


def test_it_drafts_what_followed_the_latest_occurrence_of_the_longest_suffix() -> None:
    #          0  1  2  3  4  5  6  7  8  9 10 11
    context = [5, 6, 7, 8, 9, 1, 6, 7, 2, 3, 6, 7]
    # "6 7" occurs at 1 and 6; the latest earlier one (6) was followed by 2, 3, 6, 7
    assert draft_tokens(context, max_draft=3) == [2, 3, 6]
    assert draft_tokens([1, 2, 3, 9, 9, 1, 2, 3], max_draft=2) == [9, 9]


def test_a_longer_match_wins_over_a_later_shorter_one() -> None:
    context = [1, 2, 3, 40, 41, 9, 2, 3, 50, 51, 1, 2, 3]
    # "1 2 3" (n=3) recurs at 0 -> 40; "2 3" alone would give 50 (later)
    assert draft_tokens(context, max_draft=2) == [40, 41]


def test_no_recurring_suffix_no_draft() -> None:
    assert draft_tokens([1, 2, 3, 4, 5]) == []
    assert draft_tokens([]) == [] and draft_tokens([7]) == []
    assert draft_tokens([4, 5, 6, 5], min_ngram=2) == []  # a lone token is not enough


def test_the_draft_is_bounded() -> None:
    context = list(range(100)) + [0, 1]
    assert draft_tokens(context, max_draft=6) == [2, 3, 4, 5, 6, 7]
    assert len(draft_tokens(list(range(10)) * 3)) == 6


def test_a_request_drafts_while_its_yield_beats_the_measured_cost() -> None:
    from inference.engine.speculation import MAX_DRAFT, draft_pays

    # the first two drafts are a probe, whatever the cost
    assert draft_pays(produced=0, steps=0, draft_len=6, step_cost=50.0)
    assert draft_pays(produced=1, steps=1, draft_len=6, step_cost=50.0)
    # a full draft costing 4 steps: worth it at 4.5 tokens a step, not at 3.5
    assert draft_pays(produced=9, steps=2, draft_len=MAX_DRAFT, step_cost=4.0)
    assert not draft_pays(produced=7, steps=2, draft_len=MAX_DRAFT, step_cost=4.0)
    # a shorter draft costs proportionally less: half a draft costs 2.5 steps here
    assert draft_pays(produced=6, steps=2, draft_len=MAX_DRAFT // 2, step_cost=4.0)
    # free drafts (cost 1) pay whenever anything is accepted
    assert draft_pays(produced=5, steps=4, draft_len=MAX_DRAFT, step_cost=1.0)
    assert not draft_pays(produced=4, steps=4, draft_len=MAX_DRAFT, step_cost=1.0)
