"""A node's benchmarks: memory bandwidth, and its package through our own engine the way
``llama-bench`` reports a model (prompt processing and text generation tokens/s), at 1 and at 8
sequences decoding together.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass

import numpy as np

from inference.engine.request import EngineEvent, Failed, Finished, Request
from inference.engine.sampling import SamplingParams
from inference.engine.scheduler import Engine

BANDWIDTH_MIB = 128  # per array: well past any last-level cache
PROMPT_TOKENS = 512  # llama-bench's default pp512
DECODE_TOKENS = 64  # per sequence (llama-bench's tg128, halved to keep validation short)
DECODE_SEQUENCES = 8
FILLER = (
    "The engineers measured every node in the array before it took traffic: memory bandwidth, "
    "prompt processing and text generation, one sequence and many. "
)


def memory_bandwidth_gb_s(*, mib: int = BANDWIDTH_MIB, repeats: int = 8) -> float:
    """Best copy bandwidth of this process's CPUs in GB/s (10^9 bytes/s), counted the way
    STREAM counts its Copy kernel: 16 bytes per float64 element (one read, one write). numpy's
    ``copyto`` runs on one thread, so this is what one core pulls, the figure that bounds a
    single sequence's decode."""
    n = mib * 1024 * 1024 // 8
    source = np.random.default_rng(0).random(n)
    target = np.empty_like(source)
    np.copyto(target, source)  # touch every page once before timing
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - started)
    return round(16 * n / best / 1e9, 2)


@dataclass
class _Waiter:
    """Collects one request's last event on the engine thread."""

    done: threading.Event
    result: Finished | Failed | None = None

    def __call__(self, event: EngineEvent) -> None:
        if isinstance(event, Finished | Failed):
            self.result = event
            self.done.set()


class BenchmarkFailed(RuntimeError):
    """The engine refused or failed a benchmark request."""


def _run(
    engine: Engine, prompts: list[list[int]], max_tokens: int, timeout: float
) -> list[Finished]:
    waiters = [_Waiter(threading.Event()) for _ in prompts]
    requests = [
        Request(
            prompt=p,
            params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
            sink=w,
            speculate=False,  # llama-bench's tg: one token per step, no prompt-lookup drafts
        )
        for p, w in zip(prompts, waiters, strict=True)
    ]
    engine.submit_all(requests)
    deadline = time.monotonic() + timeout
    for waiter in waiters:
        if not waiter.done.wait(max(0.0, deadline - time.monotonic())):
            for r in requests:
                engine.cancel(r)
            raise BenchmarkFailed(f"the engine did not finish in {timeout:g} s")
        if isinstance(waiter.result, Failed):
            raise BenchmarkFailed(waiter.result.message)
    return [w.result for w in waiters if isinstance(w.result, Finished)]


def wait_idle(engine: Engine, *, timeout: float = 30.0) -> bool:
    """Wait until the engine has no request running or queued (requests that arrived before
    the node left the pool); False when it is still busy after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while engine.active_count or engine.queue_depth:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _filler_tokens(engine: Engine, count: int, tag: str) -> list[int]:
    model = engine.model
    assert model is not None, "engine is not loaded"
    text = f"[{tag}] " + FILLER * (count // 20 + 2)
    return model.tokenize(text, add_special=True)[:count]


def _counting_prompt(engine: Engine, tag: str) -> list[int]:
    """A prompt the model continues for as long as it is let (greedy counting)."""
    model = engine.model
    assert model is not None
    return model.tokenize(f"[{tag}] 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", add_special=True)


def prompt_tok_s(engine: Engine, *, tokens: int = PROMPT_TOKENS, timeout: float = 60.0) -> float:
    """Prefill speed of one prompt of ``tokens`` (capped by the context) in tokens/s, from the
    engine's own timings (``prefill_ms``), on a prompt no sequence holds (no reuse). Raises
    ``BenchmarkFailed`` (the engine failed it or took over ``timeout`` s), ``QueueFull``."""
    tokens = min(tokens, engine.config.ctx_per_seq - 8)
    (done,) = _run(engine, [_filler_tokens(engine, tokens, uuid.uuid4().hex)], 1, timeout)
    prefill_s = done.timings["prefill_ms"] / 1000
    return round(done.timings["prefill_tokens"] / prefill_s, 1) if prefill_s > 0 else 0.0


def decode_tok_s(
    engine: Engine, *, sequences: int, tokens: int = DECODE_TOKENS, timeout: float = 120.0
) -> float:
    """Aggregate decode tokens/s of ``sequences`` requests submitted together (one step carries
    a token of each; no prompt-lookup drafting): tokens generated after each one's first, over
    the time from the first first-token to the last finish. The prompt is greedy counting,
    which the model continues; a sequence that stops early still counts what it generated.
    Raises ``BenchmarkFailed``, ``QueueFull``."""
    run = uuid.uuid4().hex[:8]
    prompts = [_counting_prompt(engine, f"{run}-{i}") for i in range(sequences)]
    done = _run(engine, prompts, tokens, timeout)
    generated = sum(max(0, d.completion_tokens - 1) for d in done)
    window_ms = max(d.timings["total_ms"] for d in done) - min(d.timings["ttft_ms"] for d in done)
    return round(generated / (window_ms / 1000), 1) if window_ms > 0 else 0.0
