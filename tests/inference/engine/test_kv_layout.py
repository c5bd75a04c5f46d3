"""The KV layout a node is left to choose is the one it timed faster, measured once per setting."""

from __future__ import annotations

import pytest

from inference.engine import kv_blob, kv_layout
from inference.engine.llama import ContextShape, LlamaModel
from tests.inference.engine.conftest import make_engine
from tests.support.processes import bundled_model_path

pytestmark = pytest.mark.model


def test_it_picks_the_faster_layout_and_remembers_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model = LlamaModel(str(bundled_model_path()))
    try:
        shape = ContextShape(4, 512, threads=2)
        first = kv_layout.choose(model, shape)
        assert first.measured and first.fill == 256
        assert first.split_step_ms > 0 and first.unified_step_ms > 0
        assert first.unified == (first.unified_step_ms < first.split_step_ms)
        again = kv_layout.choose(model, shape)
        assert not again.measured and again.unified == first.unified
        assert again.split_step_ms == first.split_step_ms
        assert kv_layout.choose(model, ContextShape(2, 512, threads=2)).measured  # another key
    finally:
        model.close()


def test_an_engine_left_to_choose_sets_up_the_layout_it_measured(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    engine = make_engine(sequences=2, ctx_per_seq=256, kv_unified=None)
    try:
        snap = engine.snapshot()
        chosen = snap["kv_layout"]["unified"]
        assert snap["kv_settings"]["kv_unified"] == ("true" if chosen else "false")
    finally:
        engine.stop()
    engine = make_engine(sequences=2, ctx_per_seq=256, kv_unified=True)
    try:
        assert engine.snapshot()["kv_layout"] is None  # set by hand: nothing measured
        assert engine.snapshot()["kv_settings"]["kv_unified"] == "true"
    finally:
        engine.stop()


def test_a_cache_file_it_cannot_use_is_measured_again(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    kv_layout.cache_path().parent.mkdir(parents=True)
    kv_layout.cache_path().write_text("[1, 2]")
    model = LlamaModel(str(bundled_model_path()))
    try:
        assert kv_layout.choose(model, ContextShape(2, 256, threads=2)).measured
    finally:
        model.close()


def test_a_layout_that_cannot_be_timed_falls_back_to_one_stream_per_sequence(
    tmp_path, monkeypatch
) -> None:
    def cannot(*args, **kwargs):
        raise kv_blob.UnsplittableState("2048 bytes after the state (a second cache?)")

    monkeypatch.setattr(kv_layout, "choose", cannot)
    engine = make_engine(sequences=2, ctx_per_seq=256, kv_unified=None)
    try:
        snap = engine.snapshot()
        assert snap["kv_layout"] is None and snap["kv_settings"]["kv_unified"] == "false"
    finally:
        engine.stop()
