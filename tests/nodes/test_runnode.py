"""runnode's options to the engine's settings (pure)."""

from __future__ import annotations

import pytest
from django.core.management.base import CommandError

from nodes.management.commands.runnode import engine_config

OPTIONS = {
    "model": "m.gguf",
    "sequences": 8,
    "ctx_per_seq": 2048,
    "n_batch": 512,
    "prefill_chunk": 256,
    "threads": 2,
    "host_ram_mib": None,
    "max_queue": 64,
    "no_prefix_reuse": False,
    "kv_unified": "auto",
    "kv_type": "f16",
    "flash_attn": "auto",
    "speculate": "auto",
    "repeatable": False,
}


def test_host_ram_defaults_to_a_share_of_free_memory_and_zero_means_none() -> None:
    assert engine_config(OPTIONS).host_ram_mib >= 256
    assert engine_config({**OPTIONS, "host_ram_mib": 0}).host_ram_mib == 0
    assert engine_config({**OPTIONS, "host_ram_mib": 512}).host_ram_mib == 512


def test_the_llama_cpp_settings_pass_through() -> None:
    config = engine_config({**OPTIONS, "kv_type": "q8_0", "flash_attn": "on", "speculate": "off"})
    assert (config.kv_type, config.flash_attn, config.speculate) == ("q8_0", "on", "off")
    assert config.kv_unified is None  # auto: the engine times both layouts at load
    assert engine_config({**OPTIONS, "kv_unified": "on"}).kv_unified is True
    assert engine_config({**OPTIONS, "kv_unified": "off"}).kv_unified is False
    assert not config.repeatable and engine_config({**OPTIONS, "repeatable": True}).repeatable


def test_a_quantized_cache_without_flash_attention_is_refused_before_loading() -> None:
    with pytest.raises(CommandError, match="--kv-type q8_0 needs flash attention"):
        engine_config({**OPTIONS, "kv_type": "q8_0", "flash_attn": "off"})
