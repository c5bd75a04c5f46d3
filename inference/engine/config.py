"""Node settings that size the engine, and the host-RAM budget for idle sessions' KV when the
operator sets none."""

from __future__ import annotations

from dataclasses import dataclass

HOST_RAM_SHARE = 0.25  # of the memory available when the node starts, for idle sessions' KV
HOST_RAM_FLOOR_MIB = 256


def default_host_ram_mib(available_bytes: int, *, nodes_on_machine: int = 1) -> int:
    """The host-RAM budget (MiB) for idle sessions' KV when the operator sets none:
    ``HOST_RAM_SHARE`` of ``available_bytes`` (``psutil.virtual_memory().available``) split
    evenly among the node agents on the machine, at least ``HOST_RAM_FLOOR_MIB``.

    llama.cpp's own server keeps a host-memory prompt cache of 8 GiB by default
    (``--cache-ram``); a share of what is free scales with the machine instead. An agent
    session of 1,500 tokens on SmolLM2-135M (f16 K/V) is about 34 MiB, so 24 GiB free gives
    each of two nodes 3 GiB, about 90 sessions each."""
    share = int(available_bytes * HOST_RAM_SHARE / max(1, nodes_on_machine)) >> 20
    return max(HOST_RAM_FLOOR_MIB, share)


@dataclass(frozen=True)
class EngineConfig:
    """Node settings that size the engine. Memory: ``sequences * ctx_per_seq`` KV cells."""

    model_path: str
    sequences: int = 8
    ctx_per_seq: int = 2048
    n_batch: int = 512
    prefill_chunk: int = 256
    threads: int = 1
    host_ram_mib: int = 256
    max_queue: int = 64
    prefix_reuse: bool = True
    kv_unified: bool | None = False  # None: the faster layout, timed at load (tuning)
    kv_type: str = "f16"  # K and V cache type: "f16" or "q8_0" (llama.KV_TYPES)
    flash_attn: str = "auto"  # "auto" (timed at load: tuning) | "on" | "off"
    # the same seed gives the same text whether a prompt's prefix came from the KV cache or
    # was prefilled: flash attention on (auto), no drafts under speculate auto (docs/engine.md)
    repeatable: bool = False
    # speculative decoding by prompt lookup (inference.engine.speculation): "auto" drafts when
    # the step cost measured at load says a draft accepted half the time pays, and then only
    # for requests whose drafts pay; "on" always drafts; "off" never
    speculate: str = "auto"
    # drafts only while a step decodes at most this many tokens (requests' own plus drafts)
    draft_batch_limit: int = 8
    # warm starts (inference.engine.warm): lock the model in RAM where permitted, and keep
    # shared prefixes' KV in a shelf under this directory ("": none kept)
    mlock: bool = True
    prefix_dir: str = ""
