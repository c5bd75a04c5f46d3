"""The engine's counters and rates, read by ``Engine.snapshot`` for /metrics."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field


class RateWindow:
    """Tokens per second over the last ``seconds`` of steps."""

    def __init__(self, seconds: float = 10.0) -> None:
        self.seconds = seconds
        self._events: collections.deque[tuple[float, int]] = collections.deque()

    def add(self, count: int, now: float) -> None:
        if count:
            self._events.append((now, count))

    def rate(self, now: float) -> float:
        while self._events and self._events[0][0] < now - self.seconds:
            self._events.popleft()
        return sum(c for _, c in self._events) / self.seconds


class SpeedMeter:
    """Prefill speed: prompt tokens per second of the steps that prefilled, as an exponential
    moving average (weight ``alpha`` per step); 0.0 until a step of at least ``min_tokens``.
    Unlike ``RateWindow`` (throughput, 0 when idle) it says how fast the node *can* prefill,
    which the control plane uses for a request's first-byte deadline."""

    def __init__(self, *, alpha: float = 0.2, min_tokens: int = 16) -> None:
        self.alpha = alpha
        self.min_tokens = min_tokens
        self.value = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        if tokens < self.min_tokens or seconds <= 0:
            return
        speed = tokens / seconds
        self.value = speed if not self.value else self.value + self.alpha * (speed - self.value)


@dataclass
class EngineStats:
    requests_total: int = 0
    prompt_tokens_total: int = 0
    cached_prompt_tokens_total: int = 0
    generated_tokens_total: int = 0
    restored_from_host_total: int = 0
    cancelled_total: int = 0
    draft_tokens_total: int = 0
    draft_accepted_total: int = 0
    step_seconds_total: float = 0.0  # decode steps' wall time
    step_llama_seconds_total: float = 0.0  # of which inside llama.cpp (decode, sampling)
    # decoded tokens and the cells their sequences held (their mean: where decode runs, which
    # the next start's timing of the settings follows: tuning.remember_traffic)
    decode_fill_tokens_total: int = 0
    decode_fill_cells_total: int = 0
    prefill_rate: RateWindow = field(default_factory=RateWindow)
    decode_rate: RateWindow = field(default_factory=RateWindow)
    prefill_speed: SpeedMeter = field(default_factory=SpeedMeter)
