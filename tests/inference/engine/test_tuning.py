"""The settings a node is left to choose (KV layout, flash attention) are the ones it timed
fastest, measured once per setting; a repeatable node keeps flash attention on."""

from __future__ import annotations

import pytest

from inference.engine import kv_blob, tuning
from inference.engine.llama import ContextShape, LlamaModel
from tests.inference.engine.conftest import EngineDriver, make_engine
from tests.support.processes import bundled_model_path

pytestmark = pytest.mark.model


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch) -> None:
    """This test's own timings and decode-fill history (none measured before it)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("PHALANX_DECODE_FILL_FILE", raising=False)


def test_it_picks_the_fastest_setting_and_remembers_it() -> None:
    model = LlamaModel(str(bundled_model_path()))
    try:
        shape = ContextShape(4, 512, threads=2)
        settings = tuning.candidates(None, "auto")
        assert [s.name for s in settings] == [
            "split+fa-on",
            "split+fa-off",
            "unified+fa-on",
            "unified+fa-off",
        ]
        first = tuning.choose(model, shape, settings)
        assert first.measured and first.fill == 256
        assert set(first.step_ms) == {s.name for s in settings}
        fastest = min(first.step_ms, key=first.step_ms.get)
        assert tuning.Setting(first.unified, first.flash_attn).name == fastest
        again = tuning.choose(model, shape, settings)
        assert not again.measured and again.step_ms == first.step_ms
        assert tuning.choose(model, ContextShape(2, 512, threads=2), settings).measured
        only_layouts = tuning.choose(model, shape, tuning.candidates(None, "on"))
        assert only_layouts.measured and set(only_layouts.step_ms) == {
            "split+fa-on",
            "unified+fa-on",
        }
    finally:
        model.close()


def test_an_engine_left_to_choose_sets_up_what_it_measured() -> None:
    engine = make_engine(sequences=2, ctx_per_seq=256, kv_unified=None, repeatable=False)
    try:
        snap = engine.snapshot()
        chosen = snap["tuning"]
        assert len(chosen["step_ms"]) == 4 and not snap["repeatable"]
        assert snap["kv_settings"]["kv_unified"] == ("true" if chosen["unified"] else "false")
        assert snap["kv_settings"]["flash_attn"] == (
            "enabled" if chosen["flash_attn"] == "on" else "disabled"
        )
        driver = EngineDriver(engine)
        messages = [{"role": "user", "content": "Name a colour."}]
        first = driver.chat(messages, session="s", max_tokens=8)
        turn = [*messages, {"role": "assistant", "content": first.text}]
        second = driver.chat([*turn, {"role": "user", "content": "Another?"}], session="s")
        assert first.text and second.text and second.cached_tokens > 0
    finally:
        engine.stop()
    engine = make_engine(sequences=2, ctx_per_seq=256, kv_unified=True, flash_attn="off")
    try:
        assert engine.snapshot()["tuning"] is None  # both set by hand: nothing measured
        assert engine.snapshot()["kv_settings"]["flash_attn"] == "disabled"
    finally:
        engine.stop()


@pytest.mark.parametrize("why", [{"repeatable": True}, {"kv_type": "q8_0"}])
def test_repeatable_or_a_quantized_cache_keeps_flash_attention_on(why) -> None:
    engine = make_engine(
        sequences=2, ctx_per_seq=256, kv_unified=None, **{"repeatable": False, **why}
    )
    try:
        snap = engine.snapshot()
        assert set(snap["tuning"]["step_ms"]) == {"split+fa-on", "unified+fa-on"}
        assert snap["kv_settings"]["flash_attn"] == "enabled"
    finally:
        engine.stop()


def test_a_cache_file_it_cannot_use_is_measured_again() -> None:
    tuning.cache_path().parent.mkdir(parents=True)
    tuning.cache_path().write_text("[1, 2]")
    model = LlamaModel(str(bundled_model_path()))
    try:
        settings = tuning.candidates(None, "on")
        assert tuning.choose(model, ContextShape(2, 256, threads=2), settings).measured
    finally:
        model.close()


def test_settings_that_cannot_be_timed_fall_back_to_split_with_flash_attention(
    monkeypatch,
) -> None:
    def cannot(*args, **kwargs):
        raise kv_blob.UnsplittableState("2048 bytes after the state (a second cache?)")

    monkeypatch.setattr(tuning, "choose", cannot)
    engine = make_engine(sequences=2, ctx_per_seq=256, kv_unified=None, repeatable=False)
    try:
        snap = engine.snapshot()
        assert snap["tuning"] is None and snap["kv_settings"]["kv_unified"] == "false"
        assert snap["kv_settings"]["flash_attn"] == "enabled"
    finally:
        engine.stop()


def test_the_next_start_times_the_settings_where_this_nodes_decode_ran() -> None:
    """A node that served short chats is timed at their fill at its next start, not at half a
    sequence (the setting that wins differs: docs/engine.md)."""
    shape = {"sequences": 2, "ctx_per_seq": 1024, "kv_unified": None, "repeatable": False}
    engine = make_engine(**shape, speculate="off")  # one decode step a token
    try:
        assert engine.snapshot()["tuning"]["fill"] == 512  # nothing served yet: half a sequence
        driver = EngineDriver(engine)
        while engine.stats.decode_fill_tokens_total < tuning.TRAFFIC_MIN_TOKENS:
            asked = [{"role": "user", "content": "Tell a story about a fox."}]
            driver.submit(asked, max_tokens=160).wait()
        stats = engine.stats
        mean = stats.decode_fill_cells_total / stats.decode_fill_tokens_total
        assert 20 < mean < 200  # a short prompt and what followed it
    finally:
        engine.stop()
    engine = make_engine(**shape)
    try:
        timed = engine.snapshot()["tuning"]
        assert timed["fill"] == tuning.fill_bucket(mean, 1024) < 512 and timed["measured"]
    finally:
        engine.stop()


def test_the_remembered_traffic_weighs_the_latest_runs_most() -> None:
    model = LlamaModel(str(bundled_model_path()))
    try:
        shape = ContextShape(4, 2048, threads=2)
        key = tuning.traffic_key(model, shape)
        assert tuning.fill_for(model, shape) == 1024 and tuning.remembered_traffic(key) == (0, 0)
        tuning.remember_traffic(key, (0, 0), cells=100 * 255, tokens=255)  # too few
        assert tuning.fill_for(model, shape) == 1024
        tuning.remember_traffic(key, (0, 0), cells=100 * 1000, tokens=1000)
        tuning.remember_traffic(key, (0, 0), cells=100 * 2000, tokens=2000)  # the same run
        assert tuning.remembered_traffic(key) == (200_000, 2000)
        assert tuning.fill_for(model, shape) == 128  # 100 cells: 2**7 is the nearest
        before = tuning.remembered_traffic(key)  # the next run counts it half
        tuning.remember_traffic(key, before, cells=1500 * 1000, tokens=1000)
        # (1,000 + 1,000) tokens, (100,000 + 1,500,000) cells: a mean of 800
        assert tuning.fill_for(model, shape) == 1024
        assert tuning.fill_for(model, ContextShape(2, 2048, threads=2)) == 1024  # another shape
    finally:
        model.close()
    assert [tuning.fill_bucket(m, 2048) for m in (1, 90, 91, 300, 5000)] == [64, 64, 128, 256, 1024]


@pytest.mark.parametrize(
    "entry",
    [
        '{"cells": 1e400, "tokens": 10}',
        '{"cells": 1' + "0" * 400 + ', "tokens": 1}',
        '{"cells": "5", "tokens": 1}',
        '{"tokens": 3}',
        "[1]",
    ],
    ids=["inf", "huge", "text", "no-cells", "not-a-dict"],
)
def test_a_remembered_fill_it_cannot_use_is_half_a_sequence(entry) -> None:
    model = LlamaModel(str(bundled_model_path()))
    try:
        shape = ContextShape(2, 512, threads=2)
        key = tuning.traffic_key(model, shape)
        tuning.TRAFFIC.path.parent.mkdir(parents=True, exist_ok=True)
        tuning.TRAFFIC.path.write_text(f'{{"{key}": {entry}}}' if entry != "[1]" else entry)
        assert tuning.remembered_traffic(key) == (0, 0)
        assert tuning.fill_for(model, shape) == 256
    finally:
        model.close()
