"""The continuous-batching engine: one model, one context, many sessions.

One thread owns the llama.cpp context and runs decode steps. Each step carries one token for
every generating request plus prompt chunks (at most ``prefill_chunk`` tokens each, at most
``n_batch`` tokens in all) of requests still prefilling, so a long prompt delays the others by
at most one chunk. New requests join at the next step; finished and cancelled ones leave it.

Design after llama.cpp's ``tools/server`` (slots, one shared batch per step); our own code.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from inference.engine import kv_blob, kv_layout
from inference.engine.llama import ContextShape, LlamaContext, LlamaError, LlamaModel
from inference.engine.sampling import Sampler, SamplingParams
from inference.engine.sequences import HostStore, Sequence, SequenceTable, common_prefix_len
from inference.engine.speculation import MAX_DRAFT, draft_pays, draft_tokens
from inference.engine.text import TextAssembler

log = logging.getLogger(__name__)

# A queued request waits for an in-flight prefill when it would share at least this many more
# tokens with it than with anything cached (one prefill chunk is about 1 s on two cores).
SHARE_WAIT_MIN_TOKENS = 64
# A request whose drafts stopped paying tries again after this many steps without drafting.
REPROBE_AFTER_STEPS = 16
# Under speculate "auto" a node drafts only when decoding 1 + MAX_DRAFT tokens of a sequence
# costs at most this many one-token steps: a draft accepted half the time then pays.
DRAFT_MAX_STEP_COST = 1 + MAX_DRAFT / 2


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
    kv_unified: bool | None = False  # None: the faster layout, timed at load (kv_layout)
    kv_type: str = "f16"  # K and V cache type: "f16" or "q8_0" (llama.KV_TYPES)
    flash_attn: str = "auto"  # "auto" | "on" | "off" (llama.FLASH_ATTN)
    # speculative decoding by prompt lookup (inference.engine.speculation): "auto" drafts when
    # the step cost measured at load says a draft accepted half the time pays, and then only
    # for requests whose drafts pay; "on" always drafts; "off" never
    speculate: str = "auto"
    # drafts only while a step decodes at most this many tokens (requests' own plus drafts)
    draft_batch_limit: int = 8


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

    @property
    def prefilling(self) -> bool:
        return bool(self.pending)


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
    prefill_rate: RateWindow = field(default_factory=RateWindow)
    decode_rate: RateWindow = field(default_factory=RateWindow)
    prefill_speed: SpeedMeter = field(default_factory=SpeedMeter)


class Engine:
    """Owns the model and context; ``start()`` loads them on the engine thread."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model: LlamaModel | None = None
        self.ctx: LlamaContext | None = None
        self.table: SequenceTable | None = None
        self.stats = EngineStats()
        self.ready = threading.Event()
        self.load_error: str | None = None
        self._queue: collections.deque[Request] = collections.deque()
        self._calls: collections.deque[tuple[Callable[[], Any], Future]] = collections.deque()
        self._active: list[Request] = []
        self._wake = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self.kv_bytes_per_token = 0
        self.draft_step_cost = float(1 + MAX_DRAFT)  # measured at load unless speculate is "off"
        self.drafting = False  # decided at load
        self.kv_layout: kv_layout.LayoutChoice | None = None  # set at load when measured

    # Public API (any thread) ------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout)

    def submit(self, request: Request) -> None:
        """Queue a request. Raises ``PromptTooLong`` or ``QueueFull`` before anything runs."""
        self.submit_all([request])

    def submit_all(self, requests: list[Request]) -> None:
        """Queue several requests at once, so that they join the same step (same composition)."""
        for request in requests:
            self._check_fits(request)
        with self._wake:
            if len(self._queue) + len(requests) > self.config.max_queue:
                raise QueueFull(f"queue is full ({self.config.max_queue} waiting)")
            self._queue.extend(requests)
            self._wake.notify()

    def _check_fits(self, request: Request) -> None:
        limit = self.config.ctx_per_seq
        if not request.prompt:
            raise PromptTooLong("the prompt is empty")
        if len(request.prompt) + request.params.max_tokens > limit:
            raise PromptTooLong(
                f"prompt of {len(request.prompt)} tokens plus max_tokens {request.params.max_tokens}"
                f" exceeds the per-sequence context of {limit} tokens"
            )

    def cancel(self, request: Request) -> None:
        with self._wake:
            request.cancelled = True
            self._wake.notify()

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn`` on the engine thread between two steps; its result comes in the future."""
        future: Future = Future()
        with self._wake:
            self._calls.append((fn, future))
            self._wake.notify()
        return future

    def clear_cache(self) -> Future:
        """Forget every idle sequence's KV and the host-RAM store (busy sequences are kept)."""

        def clear() -> int:
            assert self.table is not None
            sessions = [s.session_id for s in self.table.sequences if s.session_id and not s.busy]
            for seq in self.table.sequences:
                if not seq.busy:
                    self.table.kv.seq_truncate(seq.seq_id, 0)
                    seq.tokens.clear()
                    seq.session_id = None
                    seq.last_used = 0.0
            if not any(s.busy for s in self.table.sequences):
                self.ctx.clear()
            self.table.host.clear()
            return len(sessions)

        return self.call(clear)

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def active_count(self) -> int:
        return len(self._active)

    # Engine thread ------------------------------------------------------------------------

    def _load(self) -> None:
        cfg = self.config
        self.model = LlamaModel(cfg.model_path)
        shape = ContextShape(
            cfg.sequences,
            cfg.ctx_per_seq,
            cfg.n_batch,
            cfg.threads,
            bool(cfg.kv_unified),
            kv_type=cfg.kv_type,
            flash_attn=cfg.flash_attn,
        )
        if cfg.kv_unified is None:
            shape = replace(shape, kv_unified=self._measured_layout(shape))
        self.ctx = LlamaContext(self.model, shape)
        host = HostStore(cfg.host_ram_mib * 1024 * 1024, codec=kv_blob)
        self.table = SequenceTable(
            self.ctx,
            cfg.sequences,
            host,
            prefix_reuse=cfg.prefix_reuse,
            prefill_speed=lambda: self.stats.prefill_speed.value,
        )
        self.kv_bytes_per_token = self.model.kv_bytes_per_token(cfg.kv_type)
        if cfg.speculate != "off" and cfg.draft_batch_limit:
            self.draft_step_cost = self._measure_draft_step_cost()
        self.drafting = cfg.draft_batch_limit > 0 and (
            cfg.speculate == "on"
            or (cfg.speculate == "auto" and self.draft_step_cost <= DRAFT_MAX_STEP_COST)
        )

    def _measured_layout(self, shape: ContextShape) -> bool:
        """Whether a unified KV buffer decodes faster here (``kv_layout``); one stream per
        sequence when it cannot be timed (a model whose state ``kv_blob`` cannot tile)."""
        try:
            self.kv_layout = kv_layout.choose(self.model, shape)
        except (LlamaError, ValueError) as exc:
            log.warning("KV layout not timed (%s): one stream per sequence", exc)
            return False
        return self.kv_layout.unified

    def _measure_draft_step_cost(self, repeats: int = 3) -> float:
        """Seconds to decode ``1 + MAX_DRAFT`` tokens of one sequence over seconds for one
        token (best of ``repeats``), on the last sequence before any request owns it. 1.0 would
        make drafts free; ``1 + MAX_DRAFT`` makes them cost what they could save."""
        ctx, seq = self.ctx, self.config.sequences - 1
        if ctx.batch.capacity < 1 + MAX_DRAFT:
            return float(1 + MAX_DRAFT)  # a batch too small to draft in: never pays
        token = self.model.tokenize("The")[-1]

        def best(count: int) -> float:
            times = []
            for _ in range(repeats):
                ctx.batch.clear()
                for pos in range(count):
                    ctx.batch.add(token, pos, seq, True)
                began = time.perf_counter()
                ctx.decode()
                times.append(time.perf_counter() - began)
                ctx.seq_truncate(seq, 0)
            ctx.batch.clear()
            return min(times)

        best(1)  # warm-up: the first decode allocates llama.cpp's compute buffers
        return best(1 + MAX_DRAFT) / best(1)

    def _run(self) -> None:
        try:
            self._load()
        except Exception as exc:  # noqa: BLE001 - reported on /health
            self.load_error = str(exc)
            log.exception("engine failed to load")
            return
        self.ready.set()
        while True:
            with self._wake:
                while not (self._stopping or self._calls or self._queue or self._active):
                    self._wake.wait()
                if self._stopping:
                    break
            self._run_calls()
            self._drop_cancelled()
            self._admit()
            if self._active:
                self._step()
        self._shutdown()

    def _shutdown(self) -> None:
        for req in list(self._active):
            self._finish(req, "cancelled")
        if self.ctx:
            self.ctx.close()
        if self.model:
            self.model.close()

    def _run_calls(self) -> None:
        while self._calls:
            with self._wake:
                fn, future = self._calls.popleft()
            try:
                future.set_result(fn())
            except Exception as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)

    def _drop_cancelled(self) -> None:
        with self._wake:
            for req in [r for r in self._queue if r.cancelled]:
                self._queue.remove(req)
                self.stats.cancelled_total += 1
        for req in [r for r in self._active if r.cancelled]:
            self.stats.cancelled_total += 1
            self._finish(req, "cancelled")

    def _admit(self) -> None:
        assert self.table is not None
        with self._wake:
            waiting = list(self._queue)
        for req in waiting:
            if self.table.is_busy(req.session_id):
                continue  # a session's turns run one at a time, in order
            if self._prefix_arriving(req):
                continue  # another request is prefilling the same prefix: share it when done
            began = time.perf_counter()
            assignment = self.table.acquire(req.session_id, req.prompt)
            if assignment is None:
                break  # every sequence is busy
            req.kv_swap_s = time.perf_counter() - began  # victim copied out, session copied in
            with self._wake:
                self._queue.remove(req)
            self._start(req, assignment.sequence, assignment.cached_tokens)
            if assignment.restored_from_host:
                self.stats.restored_from_host_total += 1

    def _prefix_arriving(self, req: Request) -> bool:
        """True when a request still prefilling shares at least ``SHARE_WAIT_MIN_TOKENS`` more
        prompt tokens with ``req`` than any cache holds now: waiting a few steps for it is
        cheaper than prefilling the same system prompt twice."""
        if not self.config.prefix_reuse:
            return False
        arriving = max(
            (common_prefix_len(r.prompt, req.prompt) for r in self._active if r.prefilling),
            default=0,
        )
        if arriving < SHARE_WAIT_MIN_TOKENS:
            return False
        return (
            arriving - self.table.cached_prefix(req.session_id, req.prompt) >= SHARE_WAIT_MIN_TOKENS
        )

    def _start(self, req: Request, seq: Sequence, cached: int) -> None:
        assert self.model is not None and self.table is not None
        req.seq = seq
        req.cached_tokens = cached
        req.pending = req.prompt[cached:]
        req.admitted_at = time.perf_counter()
        req.assembler = TextAssembler(stops=req.params.stop)
        try:
            req.sampler = Sampler(self.model, req.params)
        except LlamaError as exc:
            self.table.release(seq)
            req.sink(Failed(str(exc), client_error=True))
            return
        self.stats.requests_total += 1
        self.stats.prompt_tokens_total += len(req.prompt)
        self.stats.cached_prompt_tokens_total += cached
        self._active.append(req)

    def _step(self) -> None:
        assert self.ctx is not None
        batch = self.ctx.batch
        batch.clear()
        to_sample: list[tuple[Request, int]] = []
        decoding = [r for r in self._active if not r.prefilling]
        drafts = self._drafts(decoding)
        verify: list[tuple[Request, list[int], list[int]]] = []
        for req in decoding:
            seq = req.seq
            pos = len(seq.tokens)
            draft = drafts.get(req.id, [])
            indices = [batch.add(req.last_token, pos, seq.seq_id, True)]
            indices += [batch.add(t, pos + 1 + k, seq.seq_id, True) for k, t in enumerate(draft)]
            verify.append((req, draft, indices))
        chunks = self._add_prefill_chunks(to_sample)
        started = time.perf_counter()
        try:
            self.ctx.decode()
        except LlamaError as exc:
            for req in list(self._active):
                req.sink(Failed(str(exc)))
                self._finish(req, "error", notify=False)
            return
        now = time.perf_counter()
        for req, chunk in chunks:
            req.seq.tokens.extend(chunk)
        prefilled = sum(len(c) for _, c in chunks)
        self.stats.prefill_rate.add(prefilled, now)
        self.stats.prefill_speed.add(prefilled, now - started)
        decoded = sum(self._verify(req, draft, indices) for req, draft, indices in verify)
        self.stats.decode_rate.add(decoded, now)
        for req, index in to_sample:
            self._on_token(req, self.ctx.sample(req.sampler.ptr, index))

    def _drafts(self, decoding: list[Request]) -> dict[int, list[int]]:
        """Prompt-lookup drafts for this step, by request id, while the step decodes at most
        ``draft_batch_limit`` tokens (drafting pays while a step is bound by reading the
        weights, not by arithmetic: a few sequences, not a full batch)."""
        drafts: dict[int, list[int]] = {}
        if not self.drafting:
            return drafts
        room = min(self.config.draft_batch_limit, self.ctx.batch.capacity) - len(decoding)
        for req in decoding:
            if room <= 0:
                break
            left = min(
                req.params.max_tokens - req.generated - 1,
                self.config.ctx_per_seq - len(req.seq.tokens) - 2,
                room,
            )
            if left <= 0 or not req.speculate:
                continue
            if not self._may_draft(req, 1):  # not even one token pays: skip the lookup
                continue
            draft = draft_tokens([*req.seq.tokens, req.last_token], max_draft=min(MAX_DRAFT, left))
            if draft and self._may_draft(req, len(draft)):
                drafts[req.id] = draft
                room -= len(draft)
        return drafts

    def _may_draft(self, req: Request, draft_len: int) -> bool:
        """``draft_pays`` for ``req`` (always True under speculate "on"); a request whose drafts
        stopped paying is probed afresh after ``REPROBE_AFTER_STEPS`` steps (its output may turn
        from prose to echoed JSON)."""
        if self.config.speculate == "on" or draft_pays(
            produced=req.draft_produced,
            steps=req.draft_steps,
            draft_len=draft_len,
            step_cost=self.draft_step_cost,
        ):
            return True
        req.draft_skips += 1
        if req.draft_skips >= REPROBE_AFTER_STEPS:
            req.draft_steps = req.draft_produced = req.draft_skips = 0
        return False

    def _verify(self, req: Request, draft: list[int], indices: list[int]) -> int:
        """Sample the request's next token and each draft position in turn, keeping drafted
        tokens while the model picks them; the KV cells of the rest are dropped. Returns the
        tokens generated. With no draft this is one ordinary sample."""
        seq = req.seq
        seq.tokens.append(req.last_token)
        if draft:  # counted first: a token below may finish the request and report them
            req.drafted += len(draft)
            self.stats.draft_tokens_total += len(draft)
        produced = 0
        for k, index in enumerate(indices):
            token = self.ctx.sample(req.sampler.ptr, index)
            produced += 1
            self._on_token(req, token)
            confirmed = k < len(draft) and token == draft[k]
            if req not in self._active or not confirmed:
                break
            seq.tokens.append(token)  # its KV is in the cache: it was decoded as draft[k]
            req.accepted += 1
        if draft:
            req.draft_steps += 1
            req.draft_produced += produced
            self.stats.draft_accepted_total += produced - 1
            self.ctx.seq_truncate(seq.seq_id, len(seq.tokens))
        return produced

    def _add_prefill_chunks(
        self, to_sample: list[tuple[Request, int]]
    ) -> list[tuple[Request, list[int]]]:
        """Append prompt chunks to the batch, oldest request first; returns what was added."""
        batch = self.ctx.batch
        added = []
        for req in [r for r in self._active if r.prefilling]:
            take = min(batch.room, self.config.prefill_chunk, len(req.pending))
            if take <= 0:
                break
            chunk, req.pending = req.pending[:take], req.pending[take:]
            start = len(req.seq.tokens)
            for offset, token in enumerate(chunk):
                is_last = not req.pending and offset == take - 1
                index = batch.add(token, start + offset, req.seq.seq_id, is_last)
            if not req.pending:
                to_sample.append((req, index))
            added.append((req, chunk))
        return added

    def _on_token(self, req: Request, token: int) -> None:
        assert self.model is not None
        if not req.first_token_at:
            req.first_token_at = time.perf_counter()
        if self.model.is_eog(token):
            self._finish(req, "stop")
            return
        req.generated += 1
        self.stats.generated_tokens_total += 1
        delta = req.assembler.push(self.model.piece(token))
        if delta:
            req.sink(TextDelta(delta))
        if req.assembler.stopped:
            self._finish(req, "stop")
        elif (
            req.generated >= req.params.max_tokens
            or len(req.seq.tokens) + 1 >= self.config.ctx_per_seq
        ):
            self._finish(req, "length")
        else:
            req.last_token = token

    def _finish(self, req: Request, reason: str, *, notify: bool = True) -> None:
        tail = req.assembler.finish() if req.assembler else ""
        if tail and notify and reason != "cancelled":
            req.sink(TextDelta(tail))
        if req.sampler:
            req.sampler.close()
        if req.seq is not None:
            self.table.release(req.seq)
        if req in self._active:
            self._active.remove(req)
        if notify:
            req.sink(self._finished_event(req, reason))

    def _finished_event(self, req: Request, reason: str) -> Finished:
        end = time.perf_counter()
        first = req.first_token_at or end
        decode_s = end - first
        timings = {
            "queue_ms": round((req.admitted_at - req.enqueued_at) * 1000, 2),
            "prompt_tokens": len(req.prompt),
            "cached_tokens": req.cached_tokens,
            "prefill_tokens": len(req.prompt) - req.cached_tokens,
            "ttft_ms": round((first - req.enqueued_at) * 1000, 2),
            # where the time to first token went: waiting for a sequence (queue_ms, which
            # includes kv_swap_ms), then prefilling beside other requests' steps (prefill_ms)
            "kv_swap_ms": round(req.kv_swap_s * 1000, 2),
            "prefill_ms": round((first - req.admitted_at) * 1000, 2) if req.admitted_at else 0.0,
            "decode_tokens_per_s": round((req.generated - 1) / decode_s, 2)
            if req.generated > 1 and decode_s > 0
            else 0.0,
            "total_ms": round((end - req.enqueued_at) * 1000, 2),
            "draft_tokens": req.drafted,
            "draft_accepted": req.accepted,
            "draft_acceptance": round(req.accepted / req.drafted, 3) if req.drafted else 0.0,
        }
        return Finished(
            text=req.assembler.text if req.assembler else "",
            finish_reason=reason,
            prompt_tokens=len(req.prompt),
            cached_tokens=req.cached_tokens,
            completion_tokens=req.generated,
            timings=timings,
        )

    # Snapshot for /metrics and /slots (read from other threads; plain ints) -------------

    def snapshot(self) -> dict[str, Any]:
        now = time.perf_counter()
        table = self.table
        seqs = table.sequences if table else []
        active = sum(1 for s in seqs if s.busy)
        idle = sum(1 for s in seqs if not s.busy and s.session_id is not None)
        kv_tokens = sum(len(s.tokens) for s in seqs)
        s = self.stats
        return {
            "ready": self.ready.is_set(),
            "requests_total": s.requests_total,
            "prompt_tokens_total": s.prompt_tokens_total,
            "cached_prompt_tokens_total": s.cached_prompt_tokens_total,
            "generated_tokens_total": s.generated_tokens_total,
            "restored_from_host_total": s.restored_from_host_total,
            "cancelled_total": s.cancelled_total,
            "draft_tokens_total": s.draft_tokens_total,
            "draft_accepted_total": s.draft_accepted_total,
            "restores_skipped_total": table.restores_skipped if table else 0,
            "restores_failed_total": table.restores_failed if table else 0,
            "draft_step_cost": round(self.draft_step_cost, 3),
            "drafting": self.drafting,
            "busy": 1 if self._active else 0,
            "sequences_total": self.config.sequences,
            "sequences_active": active,
            "sequences_idle": idle,
            "sequences_host": len(table.host) if table else 0,
            "queue_depth": len(self._queue),
            "kv_used_tokens": kv_tokens,
            "kv_used_bytes": kv_tokens * self.kv_bytes_per_token,
            "kv_capacity_tokens": self.config.sequences * self.config.ctx_per_seq,
            "host_ram_bytes": table.host.used_bytes if table else 0,
            "host_ram_shared_saved_bytes": table.host.shared_bytes_saved if table else 0,
            "host_prefixes": len(table.host.prefixes) if table else 0,
            "host_ram_budget_bytes": self.config.host_ram_mib * 1024 * 1024,
            # as llama.cpp reports it set the context up (None until loaded)
            "kv_settings": vars(self.ctx.settings) if self.ctx else None,
            # how the layout was chosen when the node was left to choose (None: set by hand)
            "kv_layout": asdict(self.kv_layout) if self.kv_layout else None,
            "reused_token_ratio": (s.cached_prompt_tokens_total / s.prompt_tokens_total)
            if s.prompt_tokens_total
            else 0.0,
            "prefill_tokens_per_second": s.prefill_rate.rate(now),
            "decode_tokens_per_second": s.decode_rate.rate(now),
            "prefill_speed_tokens_per_second": s.prefill_speed.value,
        }

    def slots(self) -> list[dict[str, Any]]:
        if not self.table:
            return []
        return [
            {
                "id": s.seq_id,
                "state": "active" if s.busy else ("idle" if s.session_id else "free"),
                "session_id": s.session_id,
                "n_tokens": len(s.tokens),
            }
            for s in self.table.sequences
        ]
