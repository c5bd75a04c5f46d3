"""The continuous-batching engine: one model, one context, many sessions.

One thread owns the llama.cpp context and runs decode steps. Each step carries one token for
every generating request plus prompt chunks (at most ``prefill_chunk`` tokens each, at most
``n_batch`` tokens in all) of requests still prefilling, so a long prompt delays the others by
at most one chunk. New requests join at the next step; finished and cancelled ones leave it.

Design after llama.cpp's ``tools/server`` (slots, one shared batch per step); our own code.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, replace
from typing import Any

from inference.engine import kv_blob, tuning, warm
from inference.engine.config import EngineConfig
from inference.engine.decode_step import DecodeStep
from inference.engine.host_store import HostStore
from inference.engine.llama import ContextShape, LlamaContext, LlamaError, LlamaModel
from inference.engine.request import Failed, PromptTooLong, QueueFull, Request
from inference.engine.retime import Retiming
from inference.engine.sampling import Sampler
from inference.engine.sequences import Sequence, SequenceTable
from inference.engine.speculation import MAX_DRAFT
from inference.engine.stats import EngineStats
from inference.engine.text import TextAssembler
from inference.engine.token_prefix import common_prefix_len

log = logging.getLogger(__name__)

# A queued request waits for an in-flight prefill when it would share at least this many more
# tokens with it than with anything cached (one prefill chunk is about 1 s on two cores).
SHARE_WAIT_MIN_TOKENS = 64
TRAFFIC_SAVE_S = 300.0  # how often the decode fill goes to tuning.remember_traffic while serving
# Under speculate "auto" a node drafts only when decoding 1 + MAX_DRAFT tokens of a sequence
# costs at most this many one-token steps: a draft accepted half the time then pays.
DRAFT_MAX_STEP_COST = 1 + MAX_DRAFT / 2


class Engine(DecodeStep, Retiming):
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
        self.tuning: tuning.Tuning | None = None  # set at load when settings were measured
        self._base_shape: ContextShape | None = None  # before the timed settings (retime.py)
        self._candidates: list[tuning.Setting] = []
        self._timed_fills: set[int] = set()
        self._traffic_key = ""  # of the shape the settings were timed for (tuning.traffic_key)
        self._traffic_before = (0, 0)  # the decode fill remembered when it loaded (cells, tokens)
        self._traffic_saved = (0, time.monotonic())  # decode fill tokens handed on; when
        self.prefixes: warm.PrefixKeeper | None = None  # the shelf of shared prefixes
        self.warm: dict[str, Any] = {}  # how the start went (_warm_start): /health's "warm"

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

    def hold_prefix(self, tokens: list[int]) -> Future:
        """Prefill ``tokens`` (a registered agent's opening) into a free sequence and keep
        them on the prefix shelf (``warm.PrefixKeeper.hold``): its future gives ``"held"``,
        ``"prefilled"`` or ``"busy"``, or raises ``ValueError`` when they cannot fit."""

        def hold() -> str:
            assert self.prefixes is not None and self.table is not None
            return self.prefixes.hold(self.table, tokens, self.config.n_batch)

        return self.call(hold)

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def active_count(self) -> int:
        return len(self._active)

    # Engine thread ------------------------------------------------------------------------

    def _load(self) -> None:
        cfg = self.config
        refusal = warm.mlock_refusal(os.path.getsize(cfg.model_path)) if cfg.mlock else "off"
        self.model = LlamaModel(cfg.model_path, mlock=not refusal)
        shape = ContextShape(
            cfg.sequences,
            cfg.ctx_per_seq,
            cfg.n_batch,
            cfg.threads,
            bool(cfg.kv_unified),
            kv_type=cfg.kv_type,
            flash_attn=self._flash_attn_choice(),
        )
        self._traffic_key = tuning.traffic_key(self.model, shape)
        self._traffic_before = tuning.remembered_traffic(self._traffic_key)
        self._base_shape = shape
        self._candidates = tuning.candidates(cfg.kv_unified, shape.flash_attn)
        shape = self._tuned(shape, self._candidates)
        self.ctx = LlamaContext(self.model, shape)
        host = HostStore(cfg.host_ram_mib * 1024 * 1024, codec=kv_blob)
        self.prefixes = self._prefix_keeper(self.ctx)
        self.table = SequenceTable(
            self.ctx,
            cfg.sequences,
            host,
            prefix_reuse=cfg.prefix_reuse,
            prefill_speed=lambda: self.stats.prefill_speed.value,
            on_shared=self.prefixes.shared,
        )
        self.kv_bytes_per_token = self.model.kv_bytes_per_token(cfg.kv_type)
        if cfg.speculate != "off" and cfg.draft_batch_limit:
            self.draft_step_cost = self._measure_draft_step_cost()
        self.drafting = cfg.draft_batch_limit > 0 and (
            cfg.speculate == "on"
            or (
                cfg.speculate == "auto"
                and not cfg.repeatable
                and self.draft_step_cost <= DRAFT_MAX_STEP_COST
            )
        )
        self._warm_start(refusal)

    def _prefix_keeper(self, ctx: LlamaContext) -> warm.PrefixKeeper:
        """The shelf of shared prefixes for ``ctx`` (the engine's context: its settings name
        the shelf's directory)."""
        return warm.PrefixKeeper(self._shelf(), ctx, self.config.ctx_per_seq - 1)

    def _warm_up(self, ctx: LlamaContext) -> float:
        """``warm.warm_up_ms`` on the last sequence of ``ctx``; milliseconds."""
        return warm.warm_up_ms(ctx, self.model.tokenize("The")[-1], self.config.sequences - 1)

    def _shelf(self) -> warm.PrefixShelf | None:
        cfg = self.config
        if not cfg.prefix_dir or not cfg.prefix_reuse:
            return None
        flash = self.ctx.settings.flash_attn if self.ctx.settings else cfg.flash_attn
        where = warm.shelf_dir(
            cfg.prefix_dir, cfg.model_path, kv_type=cfg.kv_type, flash_attn=str(flash)
        )
        return warm.PrefixShelf(where)

    def _prefixes_loaded(self) -> int:
        """``PrefixKeeper.load``; a shelf that cannot be read is a cold start, not a failure."""
        try:
            return self.prefixes.load(self.table.sequences, max(1, self.config.sequences // 2))
        except OSError as exc:
            log.warning("shared prefixes not loaded: %s", exc)
            return 0

    def _warm_start(self, mlock_refusal: str) -> None:
        """Before the node says it is ready: a warm-up decode, then the saved shared prefixes
        into free sequences (half of them at most: the rest stay free for sessions)."""
        took = self._warm_up(self.ctx)
        loaded = self._prefixes_loaded()
        self.warm = {
            "resident": "mlock" if self.model.locked else "mmap",
            "mlock_refused": self.model.lock_refused or mlock_refusal,
            "warmup_ms": round(took, 1),
            "prefixes_loaded": loaded,
        }

    def _flash_attn_choice(self) -> str:
        """``--flash-attn`` as given, but ``auto`` is on for a repeatable node (reused and
        fresh prefixes then give the same text) and for a quantized cache (llama.cpp quantizes
        V only with flash attention); otherwise ``auto`` stays to be measured."""
        cfg = self.config
        if cfg.flash_attn == "auto" and (cfg.repeatable or cfg.kv_type != "f16"):
            return "on"
        return cfg.flash_attn

    def _tuned(self, shape: ContextShape, settings: list[tuning.Setting]) -> ContextShape:
        """``shape`` with the fastest of ``settings`` (``tuning``) when there is a choice; one
        stream per sequence and flash attention on when it cannot be timed (a model whose
        state ``kv_blob`` cannot tile)."""
        chosen = settings[0]
        if len(settings) > 1:
            try:
                self.tuning = tuning.choose(self.model, shape, settings)
                self._timed_fills.add(self.tuning.fill)
                chosen = tuning.Setting(self.tuning.unified, self.tuning.flash_attn)
            except (LlamaError, ValueError) as exc:
                log.warning("settings not timed (%s): %s", exc, chosen.name)
        return replace(shape, kv_unified=chosen.unified, flash_attn=chosen.flash_attn)

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
            if not self._active or time.monotonic() - self._traffic_saved[1] > TRAFFIC_SAVE_S:
                self._remember_traffic()  # gone idle, or a while since the last time
            if not (self._active or self._queue or self._calls):
                self._retime_for_traffic()  # retime.py: once per traffic fill a run
        self._shutdown()

    def _remember_traffic(self) -> None:
        """Hand this run's decode fill to ``tuning.remember_traffic`` when it grew by
        ``TRAFFIC_MIN_TOKENS`` since the last time (when the engine goes idle, every
        ``TRAFFIC_SAVE_S`` seconds while it is busy, and at stop: a killed node loses little)."""
        tokens, saved = self.stats.decode_fill_tokens_total, self._traffic_saved[0]
        if self._traffic_key and tokens - saved >= tuning.TRAFFIC_MIN_TOKENS:
            cells = self.stats.decode_fill_cells_total
            tuning.remember_traffic(self._traffic_key, self._traffic_before, cells, tokens)
            saved = tokens
        self._traffic_saved = (saved, time.monotonic())

    def _shutdown(self) -> None:
        self._remember_traffic()
        for req in list(self._active):
            self._finish(req, "cancelled")
        if self.prefixes:
            self.prefixes.close()  # prefix files being written are finished
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
            "step_seconds_total": s.step_seconds_total,
            "step_llama_seconds_total": s.step_llama_seconds_total,
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
            # how KV layout and flash attention were chosen when the node was left to choose
            # (None: both set by hand)
            "tuning": asdict(self.tuning) if self.tuning else None,
            "repeatable": self.config.repeatable,
            "reused_token_ratio": (s.cached_prompt_tokens_total / s.prompt_tokens_total)
            if s.prompt_tokens_total
            else 0.0,
            "prefill_tokens_per_second": s.prefill_rate.rate(now),
            "decode_tokens_per_second": s.decode_rate.rate(now),
            "prefill_speed_tokens_per_second": s.prefill_speed.value,
            "warm": self.warm,
            "prefixes_saved_total": self.prefixes.saved if self.prefixes else 0,
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
