"""The settings a node is left to choose (KV layout, flash attention) are the ones it timed
fastest, measured once per setting; a repeatable node keeps flash attention on."""

from __future__ import annotations

import time

import pytest

from inference.engine import kv_blob, retime, tuning
from inference.engine.llama import ContextShape, LlamaError, LlamaModel
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


def test_a_llama_cpp_built_with_other_instruction_sets_is_timed_again(monkeypatch) -> None:
    """Timings kept under one build of llama.cpp are not reused under another of the same
    version (``make install`` adding the CPU's AVX-512 sets): its kernels are other code."""
    model = LlamaModel(str(bundled_model_path()))
    try:
        shape, settings = ContextShape(2, 256, threads=2), tuning.candidates(False, "auto")
        assert tuning.choose(model, shape, settings).measured
        assert not tuning.choose(model, shape, settings).measured
        built = tuning.llama_build()
        assert "AVX2 = 1" in built or "NEON = 1" in built
        monkeypatch.setattr(tuning, "llama_build", lambda: built + "AVX512_VNNI = 1 | ")
        assert tuning.choose(model, shape, settings).measured
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


def serve_short_chats(engine, *, session: str = "") -> tuple[list[dict], str | None]:
    """Short chats until the engine has decoded ``TRAFFIC_MIN_TOKENS`` tokens, each its own
    session named ``session`` and a number (none when ``session`` is empty); returns the last
    chat's messages with its answer, and its session."""
    driver, turn = EngineDriver(engine), 0
    while engine.stats.decode_fill_tokens_total < tuning.TRAFFIC_MIN_TOKENS:
        asked = [{"role": "user", "content": f"Tell a story about a fox, number {turn}."}]
        sid = f"{session}{turn}" if session else None
        answer = driver.submit(asked, session=sid, max_tokens=160).wait()[1]
        turn += 1
    return [*asked, {"role": "assistant", "content": answer.text}], sid


def wait_for_fill(engine, fill: int, timeout: float = 60.0) -> dict:
    """The engine's ``tuning`` once it says ``fill`` (timed again when idle: retime.py)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        timed = engine.snapshot()["tuning"]
        if timed["fill"] == fill:
            return timed
        time.sleep(0.1)
    raise AssertionError(f"not timed at {fill} cells: {engine.snapshot()['tuning']}")


def test_traffic_at_another_fill_is_timed_again_when_idle_and_at_the_next_start() -> None:
    """A node that serves short chats is timed at their fill, not at half a sequence (the
    setting that wins differs: docs/engine.md): at its first idle moment once it decoded
    ``TRAFFIC_MIN_TOKENS`` tokens, and at its next start."""
    shape = {"sequences": 2, "ctx_per_seq": 1024, "kv_unified": None, "repeatable": False}
    engine = make_engine(**shape, speculate="off")  # one decode step a token
    try:
        assert engine.snapshot()["tuning"]["fill"] == 512  # nothing served yet: half a sequence
        serve_short_chats(engine)
        stats = engine.stats
        mean = stats.decode_fill_cells_total / stats.decode_fill_tokens_total
        assert 20 < mean < 200  # a short prompt and what followed it
        timed = wait_for_fill(engine, tuning.fill_bucket(mean, 1024))
        snap = engine.snapshot()  # the setting in use is the one it says
        assert snap["kv_settings"]["kv_unified"] == ("true" if timed["unified"] else "false")
        assert snap["kv_settings"]["flash_attn"] == (
            "enabled" if timed["flash_attn"] == "on" else "disabled"
        )
        assert EngineDriver(engine).chat([{"role": "user", "content": "Hi!"}]).text
    finally:
        engine.stop()
    engine = make_engine(**shape)
    try:
        assert engine.snapshot()["tuning"]["fill"] == tuning.fill_bucket(mean, 1024) < 512
    finally:
        engine.stop()


@pytest.mark.parametrize("change", ["layout", "flash_attn"])
def test_a_node_moves_to_the_setting_that_wins_at_its_traffic(change, monkeypatch) -> None:
    """When the timing at the traffic's fill names another setting (here told so), the node
    serves from a context with it; the session held in a sequence comes back from host RAM
    when flash attention is unchanged, and is prefilled afresh when it changed (llama.cpp
    refuses a state of the other setting)."""
    engine = make_engine(sequences=2, ctx_per_seq=1024, kv_unified=None, repeatable=False)
    try:
        before = engine.snapshot()["tuning"]
        flash = before["flash_attn"]
        if change == "flash_attn":
            flash = "off" if flash == "on" else "on"
        unified = before["unified"] != (change == "layout")
        target = tuning.Setting(unified, flash)

        def told(model, shape, settings, fill=None):
            step_ms = {s.name: 50.0 if s == target else 100.0 for s in settings}
            return tuning.Tuning(unified, flash, step_ms, fill)

        monkeypatch.setattr(tuning, "choose", told)
        opening = engine.model.tokenize("You are a travel agent with tools. " * 10)
        assert engine.hold_prefix(opening).result(60) == "prefilled"  # a registered opening
        chat, session = serve_short_chats(engine, session="s")
        stats = engine.stats
        timed = wait_for_fill(
            engine,
            tuning.fill_bucket(
                stats.decode_fill_cells_total / stats.decode_fill_tokens_total, 1024
            ),
        )
        snap = engine.snapshot()
        assert (timed["unified"], timed["flash_attn"]) == (unified, flash)
        assert snap["kv_settings"]["kv_unified"] == ("true" if unified else "false")
        assert snap["kv_settings"]["flash_attn"] == ("enabled" if flash == "on" else "disabled")
        assert engine.call(lambda: engine.table.holding(opening)).result(10) is not None
        asked = [*chat, {"role": "user", "content": "And then?"}]
        again = EngineDriver(engine).chat(asked, session=session, max_tokens=8)
        assert again.text
        if change == "layout":
            assert again.cached_tokens > 0 and engine.stats.restored_from_host_total >= 1
        else:
            assert again.cached_tokens == 0
    finally:
        engine.stop()


def test_a_move_that_fails_or_a_repeatable_node_keeps_the_context_in_use(monkeypatch) -> None:
    """llama.cpp refusing the new context leaves the node serving as it was (its sessions
    still cached); a repeatable node is not timed again at all."""

    def refused(*args, **kwargs):
        raise LlamaError("cannot create llama context: out of memory")

    engine = make_engine(sequences=2, ctx_per_seq=1024, kv_unified=None, repeatable=True)
    timed = []
    # (a context of its own: undo() would also undo _own_cache's settings)
    with monkeypatch.context() as patched:
        patched.setattr(tuning, "choose", lambda *args, **kw: timed.append(args) or 1 / 0)
        try:
            serve_short_chats(engine)
            engine.call(engine._retime_for_traffic).result(30)  # what an idle moment runs
            assert not timed and engine.snapshot()["tuning"]["fill"] == 512
        finally:
            engine.stop()
    monkeypatch.setattr(retime, "LlamaContext", refused)
    engine = make_engine(sequences=2, ctx_per_seq=1024, kv_unified=None, repeatable=False)
    try:
        before = engine.snapshot()
        unified, flash = before["tuning"]["unified"], before["tuning"]["flash_attn"]

        def told(model, shape, settings, fill=None):  # the other layout wins, 2x
            step_ms = {s.name: 50.0 if s.unified != unified else 100.0 for s in settings}
            return tuning.Tuning(not unified, flash, step_ms, fill)

        monkeypatch.setattr(tuning, "choose", told)
        chat, session = serve_short_chats(engine, session="s")
        stats = engine.stats
        fill = tuning.fill_bucket(
            stats.decode_fill_cells_total / stats.decode_fill_tokens_total, 1024
        )
        timed = wait_for_fill(engine, fill)
        assert timed["unified"] == unified  # the setting in use, not the one that won
        assert engine.snapshot()["kv_settings"] == before["kv_settings"]
        asked = [*chat, {"role": "user", "content": "And then?"}]
        assert EngineDriver(engine).chat(asked, session=session, max_tokens=8).cached_tokens > 0
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
