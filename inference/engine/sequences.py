"""Which session owns which KV sequence: stickiness, prefix reuse, and spilling idle sessions'
KV to the host-RAM store (``host_store``) and restoring it.

The table only keeps books; the KV cache itself is touched through a ``KvStore`` (the engine's
``LlamaContext``), so these rules are testable without a model.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from inference.engine.host_store import HostEntry, HostStore
from inference.engine.token_prefix import common_prefix_len


class KvStore(Protocol):
    def seq_truncate(self, seq_id: int, keep: int) -> None: ...
    def seq_share(self, src: int, dst: int, count: int) -> None: ...
    def state_export(self, seq_id: int) -> bytes: ...

    def state_import(self, seq_id: int, blob: bytes) -> None:
        """Raises ``RuntimeError`` (``LlamaError``) when the state is refused."""


class SessionBusy(RuntimeError):
    """The session has a request in flight; the operation must wait or be refused."""


@dataclass
class Sequence:
    """One KV sequence of the context. ``tokens`` are exactly the tokens whose KV it holds."""

    seq_id: int
    session_id: str | None = None
    tokens: list[int] = field(default_factory=list)
    busy: bool = False
    last_used: float = 0.0


@dataclass(frozen=True)
class Assignment:
    """The sequence a request runs on and how many prompt tokens it reuses from the cache."""

    sequence: Sequence
    cached_tokens: int
    restored_from_host: bool


class SequenceTable:
    """Assigns sequences to sessions: stick, reuse the longest prefix, spill idle KV to host RAM."""

    def __init__(
        self,
        kv: KvStore,
        count: int,
        host: HostStore,
        *,
        prefix_reuse: bool = True,
        clock: Callable[[], float] = time.monotonic,
        prefill_speed: Callable[[], float] = lambda: 0.0,
        on_shared: Callable[[Sequence, int], None] | None = None,
    ) -> None:
        self.kv = kv
        self.sequences = [Sequence(seq_id=i) for i in range(count)]
        self.host = host
        self.prefix_reuse = prefix_reuse
        self.clock = clock
        self.prefill_speed = prefill_speed  # prompt tokens/s the engine prefills at (0: unknown)
        self.restore_speed = 0.0  # bytes/s copied back from host RAM (moving average; 0: unknown)
        self.restores_skipped = 0
        self.restores_failed = 0  # refused by llama.cpp; the prompt was prefilled instead
        # called when a sequence was given cells shared from another (warm.PrefixKeeper)
        self.on_shared = on_shared

    def resident(self, session_id: str) -> Sequence | None:
        for seq in self.sequences:
            if seq.session_id == session_id:
                return seq
        return None

    def is_busy(self, session_id: str | None) -> bool:
        seq = self.resident(session_id) if session_id else None
        return bool(seq and seq.busy)

    def acquire(self, session_id: str | None, prompt: list[int]) -> Assignment | None:
        """A sequence for a request, or None when every sequence is busy (or the session is).

        The returned sequence is marked busy and truncated to the reused prefix; at least one
        prompt token is always left to prefill, so the request gets logits to sample from.
        """
        seq = self.resident(session_id) if session_id else None
        if seq is not None and seq.busy:
            return None
        restored = False
        if seq is None:
            seq = self._free_sequence(prompt)
            if seq is None:
                return None
            # the session's own host entry leaves the store before the victim's enters it
            entry = self.host.take(session_id) if session_id else None
            self._spill_to_host(seq)
            seq.session_id = session_id
            if entry is not None and not self._restore_pays(entry, prompt):
                self.restores_skipped += 1
                entry = None
            restored = self._restore(seq, entry)
        keep = self._reuse(seq, prompt) if self.prefix_reuse else 0
        self.kv.seq_truncate(seq.seq_id, keep)
        del seq.tokens[keep:]
        seq.busy = True
        seq.last_used = self.clock()
        if session_id:
            self.host.forecast.note_turn(session_id)
        return Assignment(sequence=seq, cached_tokens=keep, restored_from_host=restored)

    def _reuse(self, seq: Sequence, prompt: list[int]) -> int:
        """Cells of ``seq`` to keep for ``prompt``: its own prefix, or a longer one shared from
        another sequence (a system prompt common to many sessions is prefilled once).

        At least one prompt token is always left to prefill, so the request gets logits."""
        limit = len(prompt) - 1
        own = min(common_prefix_len(seq.tokens, prompt), limit)
        donor, shared = None, own
        for other in self.sequences:
            if other is not seq:
                n = min(common_prefix_len(other.tokens, prompt), limit)
                if n > shared:
                    donor, shared = other, n
        if donor is None:
            return own
        self.kv.seq_truncate(seq.seq_id, 0)
        self.kv.seq_share(donor.seq_id, seq.seq_id, shared)
        seq.tokens[:] = prompt[:shared]
        if self.on_shared is not None:
            self.on_shared(seq, shared)
        return shared

    def cached_prefix(self, session_id: str | None, prompt: list[int]) -> int:
        """How many leading tokens of ``prompt`` could be reused right now (any sequence, or the
        session's own host-RAM entry)."""
        best = max((common_prefix_len(s.tokens, prompt) for s in self.sequences), default=0)
        stored = self.host.tokens(session_id) if session_id else None
        if stored is not None:
            best = max(best, common_prefix_len(stored, prompt))
        return best

    def release(self, seq: Sequence) -> None:
        seq.busy = False
        seq.last_used = self.clock()

    def rebind(self, kv: KvStore, *, keep_sessions: bool) -> None:
        """Move onto ``kv``, a context created with other settings, every sequence idle:
        sessions held in sequences go to host RAM first when ``keep_sessions`` (their states
        load in the new context), else they and the host-RAM store are forgotten; every
        sequence starts empty (shared prefixes' cells are not carried). Raises ``SessionBusy``
        while a sequence is busy."""
        if any(seq.busy for seq in self.sequences):
            raise SessionBusy("a sequence is busy")
        for seq in self.sequences if keep_sessions else []:
            self._spill_to_host(seq)  # may raise (LlamaError): the table is still whole then
        for seq in self.sequences:
            seq.tokens.clear()
            seq.session_id = None
            seq.last_used = 0.0
        if not keep_sessions:
            self.host.clear()
        self.kv = kv

    def take_unowned(self, prompt: list[int]) -> Sequence | None:
        """An idle sequence to hold a shared prefix for no session (``_free_sequence``; a
        session it held is spilled to host RAM first), or None while every one is busy."""
        seq = self._free_sequence(prompt)
        if seq is not None:
            self._spill_to_host(seq)
            seq.session_id = None
        return seq

    def holding(self, tokens: list[int]) -> Sequence | None:
        """A sequence whose KV starts with all of ``tokens``, or None."""
        for seq in self.sequences:
            if common_prefix_len(seq.tokens, tokens) >= len(tokens):
                return seq
        return None

    def _free_sequence(self, prompt: list[int]) -> Sequence | None:
        """An idle sequence for a new owner: an unowned one holding the longest prefix of
        ``prompt``, else the least recently used (its session is then spilled to host)."""
        unowned = [s for s in self.sequences if not s.busy and s.session_id is None]
        if unowned:
            return max(unowned, key=lambda s: (common_prefix_len(s.tokens, prompt), -s.last_used))
        idle = [s for s in self.sequences if not s.busy]
        return min(idle, key=lambda s: s.last_used) if idle else None

    def _spill_to_host(self, seq: Sequence) -> None:
        if seq.session_id is None:
            return  # unowned: its cells stay, as a prefix another prompt may share
        if seq.tokens:
            blob = self.kv.state_export(seq.seq_id)
            self.host.put(seq.session_id, HostEntry(tokens=list(seq.tokens), blob=blob))
        self.kv.seq_truncate(seq.seq_id, 0)
        seq.tokens.clear()
        seq.session_id = None

    def _restore_pays(self, entry: HostEntry, prompt: list[int]) -> bool:
        """Whether copying ``entry`` back beats prefilling what of it ``prompt`` can use: its
        bytes at the measured restore speed against the usable prefix at the measured prefill
        speed. Unmeasured speeds restore (optimistic); nothing usable never does."""
        usable = min(common_prefix_len(entry.tokens, prompt), len(prompt) - 1)
        if usable <= 0:
            return False
        prefill_speed = self.prefill_speed()
        if not self.restore_speed or not prefill_speed:
            return True
        return len(entry.blob) / self.restore_speed < usable / prefill_speed

    def _restore(self, seq: Sequence, entry: HostEntry | None) -> bool:
        """Copy ``entry`` into ``seq``; False (the sequence left empty, the prompt prefilled)
        when there is none or llama.cpp refuses it (a state from a node with another model,
        cache type or flash-attention setting)."""
        if entry is None:
            return False
        began = time.perf_counter()
        try:
            self.kv.state_import(seq.seq_id, entry.blob)
        except (RuntimeError, ValueError):
            self.kv.seq_truncate(seq.seq_id, 0)
            self.restores_failed += 1
            return False
        elapsed = time.perf_counter() - began
        if elapsed > 0:
            speed = len(entry.blob) / elapsed
            self.restore_speed = (
                speed if not self.restore_speed else 0.8 * self.restore_speed + 0.2 * speed
            )
        seq.tokens[:] = entry.tokens
        return True

    # Session operations (node API /sessions/<id>) -----------------------------------------

    def locate(self, session_id: str, bytes_per_token: int) -> dict | None:
        """Where a session's KV is: ``{"where": "sequence"|"host", "tokens": n, "bytes": b}``."""
        seq = self.resident(session_id)
        if seq is not None:
            return {
                "where": "sequence",
                "sequence": seq.seq_id,
                "busy": seq.busy,
                "tokens": len(seq.tokens),
                "bytes": len(seq.tokens) * bytes_per_token,
            }
        stored = self.host.tokens(session_id)
        if stored is not None:
            return {
                "where": "host",
                "sequence": None,
                "busy": False,
                "tokens": len(stored),
                "bytes": self.host.stored_bytes(session_id),
            }
        return None

    def export(self, session_id: str) -> HostEntry | None:
        seq = self.resident(session_id)
        if seq is not None:
            if seq.busy:
                raise SessionBusy(session_id)
            return HostEntry(tokens=list(seq.tokens), blob=self.kv.state_export(seq.seq_id))
        return self.host.get(session_id)

    def import_(self, session_id: str, entry: HostEntry) -> bool:
        """Place an exported state in host RAM; the session's next turn restores it (it is
        expected soon: a session is moved when its next turn is routed here)."""
        self.erase(session_id)
        self.host.forecast.expect(session_id)
        return self.host.put(session_id, entry)

    def erase(self, session_id: str) -> bool:
        """Forget a session's KV wherever it is; returns whether there was any."""
        found = session_id in self.host
        self.host.drop(session_id)
        seq = self.resident(session_id)
        if seq is not None:
            if seq.busy:
                raise SessionBusy(session_id)
            self.kv.seq_truncate(seq.seq_id, 0)
            seq.tokens.clear()
            seq.session_id = None
            found = True
        return found
