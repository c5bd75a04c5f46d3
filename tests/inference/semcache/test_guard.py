"""The second check of a semantic-cache hit (inference/semcache/guard.py): what an embedding
blurs (numbers, negation, opposites, units, dates, entities) must agree."""

from __future__ import annotations

import pytest

from inference.semcache.guard import disagreement


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Turn on the kitchen lights", "Switch the kitchen lights on"),
        ("Book 3 seats to Rome", "book three seats to rome please"),
        ("Weather in Paris tomorrow?", "Tomorrow's forecast for paris"),
        ("Meeting on May 5 at 3pm", "meeting May 5th, 3 pm"),
        ("Show invoice INV-1042", "show me invoice inv-1042"),
        ("Convert 5 km to miles", "How many miles is 5 km?"),
        ("I don't want onions", "I do not want onions"),
        ("May I reset my password?", "Could I reset my password?"),
    ],
)
def test_paraphrases_agree(a, b) -> None:
    assert disagreement(a, b) == ""


@pytest.mark.parametrize(
    ("a", "b", "why"),
    [
        ("Turn on the kitchen lights", "Turn off the kitchen lights", "opposites: on / off"),
        ("Sort ascending by date", "sort by date, descending", "opposites"),
        ("Book 3 seats to Rome", "Book 4 seats to Rome", "numbers differ"),
        ("restart nginx on web-2", "restart nginx on web-3", "numbers differ"),
        ("Weather in Paris tomorrow?", "Weather in Lyon tomorrow?", "entities differ"),
        ("Weather in Paris today?", "Weather in Paris tomorrow?", "dates differ"),
        ("Meeting on May 5", "Meeting on June 5", "dates differ"),
        ("Does it support IPv6?", "Does it not support IPv6?", "one is negated"),
        ("Pizza with onions", "Pizza without onions", "one is negated"),
        ("Set it to 20 celsius", "Set it to 20 fahrenheit", "units differ"),
        ("Price in USD", "Price in EUR", "units differ"),
        (
            'search_web {"query": "flights to Rome"}',
            'search_web {"query": "flights to Oslo"}',
            "entities",
        ),
    ],
)
def test_near_misses_differ_and_say_why(a, b, why) -> None:
    assert why in disagreement(a, b)
    assert why.split(":")[0] in disagreement(b, a)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Flights from Paris to London on Friday", "Flights from London to Paris on Friday"),
        (
            "Transfer 500 dollars from checking to savings",
            "Transfer 500 dollars from savings to checking",
        ),
        ("what is 7 - 3", "what is 7 + 3"),
        ("what is 12 * 4", "what is 12 / 4"),
        ("find rows where x > 5", "find rows where x < 5"),
        ("Will it be warmer tomorrow?", "Is it going to be colder tomorrow?"),
        ("show laptops priced under $1000", "show laptops priced over $1000"),
        ("recipes with meat", "meat-free recipes"),
        ("the best laptop for students", "the worst laptop for students"),
        ("打开厨房的灯", "关闭厨房的灯"),
        ("Включи свет", "Выключи свет"),
        ('read_file {"path": "/srv/README.md"}', 'read_file {"path": "/srv/readme.md"}'),
        ('get_commit {"sha": "AbCdEf1"}', 'get_commit {"sha": "abcdef1"}'),
        ('list_items {"limit": 1}', 'list_items {"limit": true}'),
    ],
)
def test_near_misses_found_by_attacking_the_check_differ(a, b) -> None:
    assert disagreement(a, b)
