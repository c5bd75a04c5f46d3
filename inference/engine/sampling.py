"""Sampling parameters of one request and the llama.cpp sampler chain built from them."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import llama_cpp as C

from inference.engine.llama import LlamaError, LlamaModel


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings, in OpenAI / llama-server terms.

    ``temperature <= 0`` means greedy. ``seed`` fixes the random stream (same seed and same batch
    composition, same text). ``grammar`` is GBNF text with a ``root`` rule, or None.
    """

    max_tokens: int = 256
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int = field(default_factory=lambda: random.randrange(1 << 31))
    stop: tuple[str, ...] = ()
    grammar: str | None = None


Stage = tuple[str, tuple]
"""One stage of a sampler chain: a llama.cpp sampler name and its arguments."""


def sampler_plan(p: SamplingParams) -> list[Stage]:
    """The sampler chain for ``p``, in order, as ``(stage, args)`` pairs; pure (no model).

    After the grammar, the order is that of llama.cpp's default sampler sequence
    (``common_params_sampling::samplers`` in ``common/common.h``: penalties, top-k, top-p,
    min-p, temperature), ending in the seeded distribution; greedy replaces all but the
    penalties. A stage whose setting is neutral (top-k 0, top-p 1, min-p 0, no penalty) is
    left out; ``temperature <= 0`` is greedy and ignores the truncation settings.
    """
    stages: list[Stage] = []
    if p.grammar:
        stages.append(("grammar", (p.grammar,)))
    if p.repeat_penalty != 1.0 or p.frequency_penalty or p.presence_penalty:
        args = (p.repeat_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty)
        stages.append(("penalties", args))
    if p.temperature <= 0:
        return [*stages, ("greedy", ())]
    if p.top_k > 0:
        stages.append(("top_k", (p.top_k,)))
    if p.top_p < 1.0:
        stages.append(("top_p", (p.top_p, 1)))
    if p.min_p > 0:
        stages.append(("min_p", (p.min_p, 1)))
    stages.append(("temp", (p.temperature,)))
    stages.append(("dist", (p.seed & 0xFFFFFFFF,)))
    return stages


class Sampler:
    """A llama.cpp sampler chain owned by one request; ``close()`` frees it."""

    def __init__(self, model: LlamaModel, params: SamplingParams) -> None:
        chain_params = C.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self.ptr = C.llama_sampler_chain_init(chain_params)
        for name, args in sampler_plan(params):
            stage = _init_stage(model, name, args)
            if not stage:
                self.close()
                raise LlamaError("llama.cpp rejected the grammar")
            C.llama_sampler_chain_add(self.ptr, stage)

    def close(self) -> None:
        if self.ptr:
            C.llama_sampler_free(self.ptr)
            self.ptr = None


def _init_stage(model: LlamaModel, name: str, args: tuple):
    """A new llama.cpp sampler for one planned stage (NULL when llama.cpp refuses it)."""
    if name == "grammar":
        return C.llama_sampler_init_grammar(model.vocab, args[0].encode(), b"root")
    if name == "penalties":
        return C.llama_sampler_init_penalties(model.n_vocab, *args)
    return getattr(C, f"llama_sampler_init_{name}")(*args)
