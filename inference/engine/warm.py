"""Warm starts: the model kept resident, a warm-up decode, and the shared prefixes on disk.

Agents of one kind open every session with the same system prompt and tool schemas (600
tokens and more). The engine already prefills such a prefix once per node and shares its KV
between sessions (``sequences``); a restarted node would prefill it again at its first turn.
So the first time a prefix is shared between two sessions (at least ``MIN_PREFIX_TOKENS``),
its KV is written to a ``PrefixShelf``: one file per prefix in a directory per model file and
KV setting (``shelf_dir``), the newest ``MAX_SAVED`` kept, most used first. At the next start
the engine loads them into free sequences before it says it is ready, so the first turn of a
known agent costs what a cache hit costs.

A file: ``MAGIC``, uses (uint32), token count n (uint32), n tokens (int32), then the
sequence's state as ``llama_state_seq_get_data`` wrote it. Files are written whole and
renamed into place; one that cannot be read is skipped (and removed).
"""

from __future__ import annotations

import hashlib
import logging
import os
import resource
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

MAGIC = b"PHXPFX01"
HEADER = struct.Struct("<8sII")  # magic, uses, token count
MIN_PREFIX_TOKENS = 64  # a shorter prefix prefills in well under a second: not worth a file
MAX_SAVED = 8  # prefix files per model and KV setting
# the uses a registered prefix (one an operator registered: ``PrefixKeeper.hold``) is saved
# with: above any learned prefix's count, so the shelf keeps it first and loads it first
REGISTERED_USES = 1 << 24


def mlock_refusal(model_bytes: int) -> str:
    """Why the model cannot be locked in RAM here ("" when it can): ``RLIMIT_MEMLOCK`` below
    the model's size for a process without ``CAP_IPC_LOCK`` (root is assumed to have it;
    llama.cpp's own warning is read when it is refused anyway)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY or soft >= model_bytes or os.geteuid() == 0:
        return ""
    return (
        f"RLIMIT_MEMLOCK is {soft >> 10} KiB and the model needs {model_bytes >> 20} MiB: "
        "raise it (ulimit -l, systemd LimitMEMLOCK=) to keep the model resident"
    )


def shelf_dir(root: str | Path, model_path: str, *, kv_type: str, flash_attn: str) -> Path:
    """The shelf of one model file (by its real path, size and modification time: a package
    version is a file of its own) and KV setting under ``root``."""
    real = os.path.realpath(model_path)
    stat = os.stat(real)
    ident = hashlib.sha1(f"{real}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()
    return Path(root) / f"{Path(real).stem[:40]}-{ident[:12]}-{kv_type}-fa-{flash_attn}"


@dataclass(frozen=True)
class SavedPrefix:
    tokens: list[int]
    uses: int
    path: Path


def prefix_key(tokens: list[int]) -> str:
    return hashlib.sha1(np.asarray(tokens, dtype=np.int32).tobytes()).hexdigest()


class PrefixShelf:
    """The prefix files of one model and KV setting in ``directory`` (see the module)."""

    def __init__(self, directory: Path, *, max_saved: int = MAX_SAVED) -> None:
        self.directory, self.max_saved = Path(directory), max_saved

    def _path(self, tokens: list[int]) -> Path:
        return self.directory / f"{prefix_key(tokens)}.prefix"

    def has(self, tokens: list[int]) -> bool:
        return self._path(tokens).is_file()

    def saved(self) -> list[SavedPrefix]:
        """Every readable prefix file, most used first (then the longest)."""
        found = []
        for path in sorted(self.directory.glob("*.prefix")):
            head = self._head(path)
            if head is not None:
                found.append(head)
        return sorted(found, key=lambda p: (-p.uses, -len(p.tokens)))

    def _head(self, path: Path) -> SavedPrefix | None:
        try:
            with path.open("rb") as f:
                magic, uses, count = HEADER.unpack(f.read(HEADER.size))
                raw = f.read(4 * count)
                tokens = np.frombuffer(raw[: len(raw) - len(raw) % 4], dtype=np.int32)
        except OSError:
            return None
        except struct.error:  # shorter than its header
            magic, uses, count, tokens = b"", 0, -1, np.zeros(0, dtype=np.int32)
        if magic != MAGIC or len(tokens) != count:
            log.warning("prefix file %s is not one: removed", path)
            path.unlink(missing_ok=True)
            return None
        return SavedPrefix(tokens=tokens.tolist(), uses=uses, path=path)

    def state(self, prefix: SavedPrefix) -> bytes:
        """The KV state saved with ``prefix``."""
        with prefix.path.open("rb") as f:
            f.seek(HEADER.size + 4 * len(prefix.tokens))
            return f.read()

    def save(self, tokens: list[int], state: bytes, *, uses: int = 1) -> Path:
        """Write ``tokens``' prefix file (replacing one of the same tokens), then remove the
        least used past ``max_saved``."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._path(tokens)
        partial = path.with_suffix(f".partial{os.getpid()}")
        with partial.open("wb") as f:
            f.write(HEADER.pack(MAGIC, uses, len(tokens)))
            f.write(np.asarray(tokens, dtype=np.int32).tobytes())
            f.write(state)
        partial.replace(path)
        for extra in self.saved()[self.max_saved :]:
            extra.path.unlink(missing_ok=True)
        return path

    def note_use(self, tokens: list[int]) -> None:
        """Count one more session that opened with ``tokens`` (the shelf keeps the most used)."""
        path = self._path(tokens)
        try:
            with path.open("r+b") as f:
                magic, uses, count = HEADER.unpack(f.read(HEADER.size))
                f.seek(0)
                f.write(HEADER.pack(magic, uses + 1, count))
        except (OSError, struct.error):
            pass


def warm_up_ms(ctx, token: int, seq_id: int, count: int = 8) -> float:
    """Decode ``count`` tokens on ``seq_id`` once and clear them: the first decode allocates
    llama.cpp's compute buffers and pages the weights in, so a client's first turn does not.
    Returns the milliseconds it took."""
    import time

    ctx.batch.clear()
    for pos in range(min(count, ctx.batch.capacity)):
        ctx.batch.add(token, pos, seq_id, pos == count - 1)
    began = time.perf_counter()
    ctx.decode()
    took = (time.perf_counter() - began) * 1000
    ctx.seq_truncate(seq_id, 0)
    ctx.batch.clear()
    return took


class PrefixKeeper:
    """The engine's side of the shelf: loads the saved prefixes into free sequences at start
    (``load``) and saves a prefix the first time two sessions share it (``shared``, called
    by ``SequenceTable`` on the engine thread; the file is written on a thread of its own)."""

    def __init__(self, shelf: PrefixShelf | None, ctx, max_tokens: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.shelf, self.ctx, self.max_tokens = shelf, ctx, max_tokens
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefix-shelf")
        self.loaded = self.saved = 0
        self.failed = 0
        self.held: list[list[int]] = []  # openings registered through ``hold``
        self._seen: set[str] = set()

    def load(self, sequences: list, limit: int) -> int:
        """Load the ``limit`` most used saved prefixes into the last of ``sequences`` (free,
        unowned: any session's prompt that starts with one reuses it). A state llama.cpp
        refuses is skipped."""
        if self.shelf is None:
            return 0
        targets = list(reversed(sequences))
        for prefix in self.shelf.saved():
            if self.loaded >= limit or not targets or len(prefix.tokens) > self.max_tokens:
                continue
            seq = targets[0]
            try:
                self.ctx.state_import(seq.seq_id, self.shelf.state(prefix))
            except (RuntimeError, OSError, ValueError) as exc:
                self.failed += 1
                log.warning("saved prefix %s not loaded: %s", prefix.path.name, exc)
                continue
            seq.tokens[:] = prefix.tokens
            self._seen.add(prefix_key(prefix.tokens))
            targets.pop(0)
            self.loaded += 1
        return self.loaded

    def shared(self, seq, count: int) -> None:
        """``seq`` now holds ``count`` cells shared from another session's: the first time
        such a prefix is seen, save it (its state is exported now, written later)."""
        if self.shelf is None or count < MIN_PREFIX_TOKENS:
            return
        tokens = list(seq.tokens[:count])
        key = prefix_key(tokens)
        if key in self._seen:
            return
        self._seen.add(key)
        if self.shelf.has(tokens):
            self.writer.submit(self.shelf.note_use, tokens)
            return
        state = self.ctx.state_export(seq.seq_id)
        self.writer.submit(self._write, tokens, state)

    def hold(self, table, tokens: list[int], chunk: int) -> str:
        """Keep ``tokens`` (a registered agent's opening) in an unowned sequence of ``table``
        (a ``SequenceTable``) and on the shelf with ``REGISTERED_USES``; on the engine thread.
        Returns ``"held"`` when a sequence already holds them, ``"prefilled"`` after prefilling
        them in chunks of ``chunk`` tokens, ``"busy"`` when every sequence is busy.
        Raises ``ValueError`` for more tokens than a sequence holds (``max_tokens``)."""
        if len(tokens) > self.max_tokens:
            raise ValueError(f"{len(tokens)} tokens exceed the {self.max_tokens} a sequence holds")
        seq = table.holding(tokens)
        exact = seq is not None and len(seq.tokens) == len(tokens)
        if seq is not None and (exact or self.shelf is None or self.shelf.has(tokens)):
            self._note_held(tokens)
            return "held"
        seq = table.take_unowned(tokens)
        if seq is None:
            return "busy"
        self._note_held(tokens)
        self._prefill(seq, tokens, chunk)
        if self.shelf is not None:
            self._seen.add(prefix_key(tokens))
            state = self.ctx.state_export(seq.seq_id)
            self.writer.submit(self._write, list(tokens), state, REGISTERED_USES)
        return "prefilled"

    def _note_held(self, tokens: list[int]) -> None:
        if list(tokens) not in self.held:
            self.held.append(list(tokens))

    def _prefill(self, seq, tokens: list[int], chunk: int) -> None:
        """Decode ``tokens`` into ``seq`` from position 0 (logits for the last one only)."""
        batch = self.ctx.batch
        self.ctx.seq_truncate(seq.seq_id, 0)
        seq.tokens.clear()
        step = max(1, min(chunk, batch.capacity))
        for start in range(0, len(tokens), step):
            batch.clear()
            for offset, token in enumerate(tokens[start : start + step]):
                batch.add(token, start + offset, seq.seq_id, start + offset == len(tokens) - 1)
            self.ctx.decode()
            seq.tokens.extend(tokens[start : start + step])
        batch.clear()

    def _write(self, tokens: list[int], state: bytes, uses: int = 2) -> None:
        try:
            self.shelf.save(tokens, state, uses=uses)
            self.saved += 1
        except Exception as exc:  # a shelf that cannot be written costs warm starts, not turns
            log.warning("shared prefix not saved: %s", exc)

    def close(self) -> None:
        self.writer.shutdown(wait=True)
