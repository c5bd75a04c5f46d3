"""The engine's decode step: one shared batch per step, then sampling, draft verification and
finishing.

A step carries one token for every generating request (plus its prompt-lookup draft, while
drafting pays) and prompt chunks of requests still prefilling (``prefill_chunk`` tokens each at
most, ``n_batch`` in all). ``DecodeStep`` is a base of ``Engine`` (``scheduler.py``), whose thread
runs it; it keeps the engine's state on ``Engine`` itself, so the step reads it as directly as
before (no indirection per token).
"""

from __future__ import annotations

import time

from inference.engine.config import EngineConfig
from inference.engine.llama import LlamaContext, LlamaError, LlamaModel
from inference.engine.request import Failed, Finished, Request, TextDelta
from inference.engine.sequences import SequenceTable
from inference.engine.speculation import MAX_DRAFT, draft_pays, draft_tokens
from inference.engine.stats import EngineStats

# A request whose drafts stopped paying tries again after this many steps without drafting.
REPROBE_AFTER_STEPS = 16


class DecodeStep:
    """The decode step of ``Engine``, run on the engine thread; the attributes below are
    ``Engine``'s (set in its ``__init__`` and at load)."""

    config: EngineConfig
    model: LlamaModel | None
    ctx: LlamaContext | None
    table: SequenceTable | None
    stats: EngineStats
    drafting: bool
    draft_step_cost: float
    _active: list[Request]

    def _step(self) -> None:
        """One step, timed: its wall time and the part inside llama.cpp's calls (decode and
        sampling) go to ``stats`` (``phalanx_node_step_*_seconds_total``; the rest is Python)."""
        assert self.ctx is not None
        began, in_llama = time.perf_counter(), self.ctx.llama_s
        try:
            self._run_step()
        finally:
            self.stats.step_seconds_total += time.perf_counter() - began
            self.stats.step_llama_seconds_total += self.ctx.llama_s - in_llama

    def _run_step(self) -> None:
        assert self.ctx is not None
        self.ctx.batch.clear()
        decoding = [r for r in self._active if not r.prefilling]
        self.stats.decode_fill_tokens_total += len(decoding)
        self.stats.decode_fill_cells_total += sum(len(r.seq.tokens) for r in decoding)
        drafts = self._drafts(decoding)
        room = self.ctx.batch.capacity - len(decoding) - sum(len(d) for d in drafts.values())
        chunks = self._prefill_chunks(room)
        verify, to_sample = self._fill_batch(decoding, drafts, chunks)
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
        self._share_step(now - started, verify, chunks, prefilled)
        self.stats.prefill_rate.add(prefilled, now)
        self.stats.prefill_speed.add(prefilled, now - started)
        decoded = sum(self._verify(req, draft, indices) for req, draft, indices in verify)
        self.stats.decode_rate.add(decoded, now)
        for req, index in to_sample:
            self._on_token(req, self.ctx.sample(req.sampler.ptr, index))

    @staticmethod
    def _share_step(
        step_s: float,
        verify: list[tuple[Request, list[int], list[int]]],
        chunks: list[tuple[Request, list[int]]],
        prefilled: int,
    ) -> None:
        """Split the step's wall time between its requests by the tokens each put into the
        batch (a decode token and its draft; a prompt chunk), as node-seconds."""
        tokens = prefilled + sum(1 + len(draft) for _, draft, _ in verify)
        if tokens <= 0:
            return
        per_token = step_s / tokens
        for req, draft, _ in verify:
            req.decode_node_s += per_token * (1 + len(draft))
        for req, chunk in chunks:
            req.prefill_node_s += per_token * len(chunk)

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

    def _prefill_chunks(self, room: int) -> list[tuple[Request, list[int]]]:
        """This step's prompt chunks within ``room`` batch tokens, oldest request first (each
        taken from its ``pending``)."""
        taken = []
        for req in [r for r in self._active if r.prefilling]:
            take = min(room, self.config.prefill_chunk, len(req.pending))
            if take <= 0:
                break
            chunk, req.pending = req.pending[:take], req.pending[take:]
            taken.append((req, chunk))
            room -= take
        return taken

    def _fill_batch(
        self,
        decoding: list[Request],
        drafts: dict[int, list[int]],
        chunks: list[tuple[Request, list[int]]],
    ) -> tuple[list[tuple[Request, list[int], list[int]]], list[tuple[Request, int]]]:
        """Put each decoding request's token and draft and each prompt chunk into the batch,
        in sequence id order: with one KV stream per sequence llama.cpp computes a batch in
        ubatches of sequences whose ids follow each other in batch order
        (``llama_batch_allocr::split_equal``, sequential), so 8 sequences in admission order
        ran as several passes over the weights (1.3x the step here). Returns what to verify
        (request, draft, batch indices) and the finished prompts' last batch index."""
        batch = self.ctx.batch
        verify: list[tuple[Request, list[int], list[int]]] = []
        to_sample: list[tuple[Request, int]] = []
        entries = [(r, None) for r in decoding] + chunks
        for req, chunk in sorted(entries, key=lambda entry: entry[0].seq.seq_id):
            seq, pos = req.seq.seq_id, len(req.seq.tokens)
            if chunk is None:
                draft = drafts.get(req.id, [])
                tokens = [req.last_token, *draft]
                indices = [batch.add(t, pos + k, seq, True) for k, t in enumerate(tokens)]
                verify.append((req, draft, indices))
                continue
            for offset, token in enumerate(chunk):
                last = not req.pending and offset == len(chunk) - 1
                index = batch.add(token, pos + offset, seq, last)
            if not req.pending:
                to_sample.append((req, index))
        return verify, to_sample

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
            # node-seconds of the engine this request used (``_share_step``)
            "prefill_node_ms": round(req.prefill_node_s * 1000, 3),
            "decode_node_ms": round(req.decode_node_s * 1000, 3),
        }
        return Finished(
            text=req.assembler.text if req.assembler else "",
            finish_reason=reason,
            prompt_tokens=len(req.prompt),
            cached_tokens=req.cached_tokens,
            completion_tokens=req.generated,
            timings=timings,
        )
