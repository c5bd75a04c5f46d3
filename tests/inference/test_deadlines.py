"""The first-byte deadline (inference/deadlines.py), pure."""

from __future__ import annotations

from inference.deadlines import first_byte_deadline, uncached_prompt_chars

HISTORY = [
    {"role": "system", "content": "s" * 1000},
    {"role": "user", "content": "u" * 300},
    {"role": "assistant", "content": "a" * 200},
    {"role": "user", "content": "v" * 100},
]


def test_a_session_on_its_node_counts_only_what_follows_the_last_reply() -> None:
    assert uncached_prompt_chars(HISTORY, cached_on_node=False) == 1600
    assert uncached_prompt_chars(HISTORY, cached_on_node=True) == 100


def test_the_deadline_grows_with_the_prefill_and_keeps_its_floor_and_cap() -> None:
    short = first_byte_deadline(
        uncached_chars=200, prefill_speed=500, floor_s=5, margin=3, cap_s=120
    )
    assert short.seconds == 5
    long = first_byte_deadline(
        uncached_chars=8000, prefill_speed=200, floor_s=5, margin=3, cap_s=120
    )
    assert long.seconds == 60  # 4,000 tokens at 200/s is 20 s, x3
    assert "4,000 uncached prompt tokens at 200 tokens/s measured" in long.why
    unmeasured = first_byte_deadline(
        uncached_chars=8000, prefill_speed=None, floor_s=5, margin=3, cap_s=120
    )
    assert unmeasured.seconds == 120 and "assumed" in unmeasured.why
