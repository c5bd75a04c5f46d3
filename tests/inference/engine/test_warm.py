"""Warm starts (inference/engine/warm.py): a prefix two sessions shared is saved with its KV,
and a restarted engine serves the first turn of a session that opens with it from that KV."""

from __future__ import annotations

import pytest

from inference.engine.warm import MAX_SAVED, PrefixShelf, shelf_dir
from tests.inference.engine.conftest import EngineDriver, make_engine
from tests.support.processes import bundled_model_path

TOOLS = ", ".join(f"tool_{i}(query: string, limit: integer)" for i in range(24))
SYSTEM = {
    "role": "system",
    "content": f"You are a careful agent for an inventory system. Tools: {TOOLS}. Answer briefly.",
}


def test_the_shelf_keeps_the_most_used_prefixes_within_its_bound(tmp_path) -> None:
    shelf = PrefixShelf(tmp_path, max_saved=3)
    for i in range(5):
        shelf.save([i] * 100, bytes([i]) * 10, uses=i + 1)
    assert [p.tokens[0] for p in shelf.saved()] == [4, 3, 2] and not shelf.has([0] * 100)
    for _ in range(3):
        shelf.note_use([2] * 100)
    saved = shelf.saved()
    assert [(p.tokens[0], p.uses) for p in saved] == [(2, 6), (4, 5), (3, 4)]
    assert shelf.state(saved[1]) == bytes([4]) * 10


def test_a_file_that_is_not_a_prefix_is_skipped_and_removed(tmp_path) -> None:
    shelf = PrefixShelf(tmp_path)
    shelf.save([7] * 80, b"state")
    (tmp_path / "broken.prefix").write_bytes(b"not a prefix file at all")
    assert [p.tokens[0] for p in shelf.saved()] == [7]
    assert not (tmp_path / "broken.prefix").exists() and MAX_SAVED >= 1


def test_a_truncated_or_short_file_is_removed_not_fatal(tmp_path) -> None:
    shelf = PrefixShelf(tmp_path)
    shelf.save([7] * 80, b"state")
    kept = shelf.saved()[0].path.read_bytes()
    (tmp_path / "cut.prefix").write_bytes(kept[: 16 + 202])  # header says 80 tokens
    (tmp_path / "tiny.prefix").write_bytes(b"PHX")
    assert [p.tokens[0] for p in shelf.saved()] == [7]
    assert sorted(p.name for p in tmp_path.iterdir()) == [shelf.saved()[0].path.name]


def test_each_model_file_and_kv_setting_has_its_own_shelf(tmp_path) -> None:
    model = str(bundled_model_path())
    f16 = shelf_dir(tmp_path, model, kv_type="f16", flash_attn="enabled")
    q8 = shelf_dir(tmp_path, model, kv_type="q8_0", flash_attn="enabled")
    assert f16 != q8 and f16 == shelf_dir(tmp_path, model, kv_type="f16", flash_attn="enabled")


@pytest.mark.model
def test_a_restarted_engine_serves_a_known_agents_first_turn_from_saved_kv(tmp_path) -> None:
    engine = make_engine(prefix_dir=str(tmp_path))
    try:
        driver = EngineDriver(engine)
        assert engine.warm["prefixes_loaded"] == 0 and engine.warm["warmup_ms"] > 0
        prefix = len(driver.tokens([SYSTEM]))
        first = driver.chat([SYSTEM, {"role": "user", "content": "Count the bolts."}], session="a")
        assert first.cached_tokens == 0
        second = driver.chat([SYSTEM, {"role": "user", "content": "Find the nuts."}], session="b")
        assert second.cached_tokens >= prefix - 8  # shared from session a's sequence
    finally:
        engine.stop()  # the prefix file being written is finished first
    assert len(PrefixShelf(next(tmp_path.iterdir())).saved()) == 1
    restarted = make_engine(prefix_dir=str(tmp_path))
    try:
        assert restarted.warm["prefixes_loaded"] == 1
        driver = EngineDriver(restarted)
        turn = driver.chat([SYSTEM, {"role": "user", "content": "Where are the washers?"}])
        assert turn.cached_tokens >= prefix - 8
    finally:
        restarted.stop()
