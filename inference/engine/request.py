"""One generation as the engine sees it: the ``Request`` a caller submits, the events its sink
receives (``TextDelta``, then ``Finished`` or ``Failed``), and the refusals ``Engine.submit``
raises before anything runs (``QueueFull``, ``PromptTooLong``)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from inference.engine.sampling import Sampler, SamplingParams
from inference.engine.sequences import Sequence
from inference.engine.text import TextAssembler


class QueueFull(RuntimeError):
    """The node's queue is at its bound; answer 503 with Retry-After."""


class PromptTooLong(ValueError):
    """Prompt plus max_tokens does not fit the per-sequence context."""


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class Finished:
    """Last event of a request. ``finish_reason``: stop, length or cancelled."""

    text: str
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    timings: dict[str, float]


@dataclass(frozen=True)
class Failed:
    """The request failed; ``client_error`` when its own content was at fault (a grammar
    llama.cpp refused), so the node answers it as a bad request, not as its own failure."""

    message: str
    client_error: bool = False


EngineEvent = TextDelta | Finished | Failed
_ids = itertools.count(1)


@dataclass(eq=False)
class Request:
    """One generation. ``sink`` receives ``EngineEvent``s on the engine thread."""

    prompt: list[int]
    params: SamplingParams
    sink: Callable[[EngineEvent], None]
    session_id: str | None = None
    speculate: bool = True  # False: one token per step, never a draft (device benchmarks)
    id: int = field(default_factory=lambda: next(_ids))
    cancelled: bool = False
    # Filled in by the engine.
    seq: Sequence | None = None
    sampler: Sampler | None = None
    assembler: TextAssembler | None = None
    pending: list[int] = field(default_factory=list)
    last_token: int = -1
    cached_tokens: int = 0
    generated: int = 0
    drafted: int = 0  # prompt-lookup draft tokens decoded for it
    accepted: int = 0  # of those, the ones the model confirmed
    draft_steps: int = 0  # steps that decoded a draft for it
    draft_produced: int = 0  # tokens those steps generated (1 + accepted each)
    draft_skips: int = 0  # steps it did not draft because drafting did not pay
    enqueued_at: float = field(default_factory=time.perf_counter)
    kv_swap_s: float = 0.0  # acquiring its sequence: spilling a victim, restoring from host
    admitted_at: float = 0.0
    first_token_at: float = 0.0
    # its share of the steps it was in: a step's wall time split by the tokens each sequence
    # put into the batch (node-seconds: what usage accounting prices)
    prefill_node_s: float = 0.0
    decode_node_s: float = 0.0

    @property
    def prefilling(self) -> bool:
        return bool(self.pending)
