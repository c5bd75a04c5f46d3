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


class Sampler:
    """A llama.cpp sampler chain owned by one request; ``close()`` frees it."""

    def __init__(self, model: LlamaModel, params: SamplingParams) -> None:
        chain_params = C.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self.ptr = C.llama_sampler_chain_init(chain_params)
        for stage in _stages(model, params):
            if not stage:
                self.close()
                raise LlamaError("llama.cpp rejected the grammar")
            C.llama_sampler_chain_add(self.ptr, stage)

    def close(self) -> None:
        if self.ptr:
            C.llama_sampler_free(self.ptr)
            self.ptr = None


def _stages(model: LlamaModel, p: SamplingParams) -> list:
    stages = []
    if p.grammar:
        stages.append(C.llama_sampler_init_grammar(model.vocab, p.grammar.encode(), b"root"))
    if p.repeat_penalty != 1.0 or p.frequency_penalty or p.presence_penalty:
        stages.append(
            C.llama_sampler_init_penalties(
                model.n_vocab,
                p.repeat_last_n,
                p.repeat_penalty,
                p.frequency_penalty,
                p.presence_penalty,
            )
        )
    if p.temperature <= 0:
        stages.append(C.llama_sampler_init_greedy())
        return stages
    if p.top_k > 0:
        stages.append(C.llama_sampler_init_top_k(p.top_k))
    if p.top_p < 1.0:
        stages.append(C.llama_sampler_init_top_p(p.top_p, 1))
    if p.min_p > 0:
        stages.append(C.llama_sampler_init_min_p(p.min_p, 1))
    stages.append(C.llama_sampler_init_temp(p.temperature))
    stages.append(C.llama_sampler_init_dist(p.seed & 0xFFFFFFFF))
    return stages
