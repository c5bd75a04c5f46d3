"""The llama.cpp seam: what a context is set up with reaches llama.cpp (read back from it)."""

from __future__ import annotations

import pytest

from inference.engine.llama import ContextShape, LlamaContext, LlamaError, LlamaModel
from tests.support.processes import bundled_model_path

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def model():
    loaded = LlamaModel(str(bundled_model_path()))
    yield loaded
    loaded.close()


def filled(model, **settings) -> LlamaContext:
    """A two-sequence context with 64 prompt tokens decoded into sequence 0."""
    ctx = LlamaContext(model, ContextShape(2, 512, **settings))
    for pos, token in enumerate(model.tokenize("The quick brown fox " * 16)[:64]):
        ctx.batch.add(token, pos, 0, want_logits=False)
    ctx.decode()
    ctx.batch.clear()
    return ctx


@pytest.mark.parametrize(
    ("settings", "flash", "kv"),
    [
        ({"kv_type": "f16", "flash_attn": "off"}, "disabled", "f16"),
        ({"kv_type": "f16", "flash_attn": "on"}, "enabled", "f16"),
        ({"kv_type": "q8_0", "flash_attn": "on"}, "enabled", "q8_0"),
        ({"kv_type": "q8_0", "flash_attn": "auto"}, "enabled", "q8_0"),
        ({"kv_type": "f16", "flash_attn": "auto"}, "enabled", "f16"),
    ],
)
def test_kv_type_and_flash_attention_reach_the_context(model, settings, flash, kv) -> None:
    ctx = filled(model, **settings)
    try:
        assert (ctx.settings.flash_attn, ctx.settings.type_k, ctx.settings.type_v) == (
            flash,
            kv,
            kv,
        )
    finally:
        ctx.close()


def test_a_q8_0_cache_holds_a_sequence_in_about_half_the_bytes(model) -> None:
    f16, q8 = filled(model, kv_type="f16"), filled(model, kv_type="q8_0")
    try:
        f16_bytes, q8_bytes = len(f16.state_export(0)), len(q8.state_export(0))
    finally:
        f16.close()
        q8.close()
    assert 0.45 < q8_bytes / f16_bytes < 0.6, (q8_bytes, f16_bytes)  # 34/64 of f16, plus headers
    assert model.kv_bytes_per_token("q8_0") / model.kv_bytes_per_token("f16") == pytest.approx(
        34 / 64, rel=0.01
    )


def test_a_quantized_cache_without_flash_attention_is_refused_with_llama_cpp_s_reason(model):
    with pytest.raises(LlamaError) as caught:
        LlamaContext(model, ContextShape(2, 512, kv_type="q8_0", flash_attn="off"))
    assert "quantized V cache requires flash_attn" in str(caught.value)
