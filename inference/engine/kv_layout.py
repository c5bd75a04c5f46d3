"""Unified KV buffer or one stream per sequence: chosen by timing both on this machine.

With one stream per sequence a decoded token attends only to its own sequence's cells; with a
unified buffer every token attends to all used cells under a mask, but a step's small matrix
products run as one bigger one and prefixes are shared without a copy. Which is faster depends
on the CPU, the model, the thread count, the sequence count and how full the sequences are
(docs/engine.md has figures), so ``measure`` times a decode step of one token per sequence
with every sequence holding ``fill`` cells, in each layout, and the faster wins. The sequences
are filled by loading a tiled state (``kv_blob.tile``) instead of prefilling them, so a
measurement takes a second or two, and its result is kept in a small JSON file per machine
(``cache_path``), keyed by everything that decides it (llama.cpp's version included); delete
the file to measure again (a measurement taken on a busy machine stays until then).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import llama_cpp

from inference.engine import kv_blob
from inference.engine.llama import ContextShape, LlamaContext, LlamaModel

STEPS = 5  # timed decode steps per layout (the median is kept), after one untimed


@dataclass(frozen=True)
class LayoutChoice:
    """The layout picked and the step times (ms) it was picked by, at ``fill`` cells each."""

    unified: bool
    split_step_ms: float
    unified_step_ms: float
    fill: int
    measured: bool = True  # False when read from the cache file


def default_fill(ctx_per_seq: int) -> int:
    """Cells per sequence to time at: half of a sequence (a session's mean fill over a life
    that ends with the sequence full), at least 64."""
    return max(64, ctx_per_seq // 2)


def cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "phalanx" / "kv-layout.json"


def choose(model: LlamaModel, shape: ContextShape, fill: int | None = None) -> LayoutChoice:
    """The measured layout for ``shape`` (its ``kv_unified`` ignored), from the cache file when
    this machine measured the same setting before. Raises ``LlamaError`` when a context cannot
    be created."""
    fill = fill or default_fill(shape.ctx_per_seq)
    key = _key(model, shape, fill)
    cached = _read_cache().get(key)
    try:
        return LayoutChoice(**{**cached, "measured": False})
    except TypeError:  # none, or written by another version: measured again
        pass
    choice = measure(model, shape, fill)
    _write_cache(key, choice)
    return choice


def measure(model: LlamaModel, shape: ContextShape, fill: int) -> LayoutChoice:
    split = _step_ms(model, replace(shape, kv_unified=False), fill)
    unified = _step_ms(model, replace(shape, kv_unified=True), fill)
    return LayoutChoice(
        unified=unified < split, split_step_ms=split, unified_step_ms=unified, fill=fill
    )


def _step_ms(model: LlamaModel, shape: ContextShape, fill: int) -> float:
    """Median milliseconds of a decode step of one token for each of ``shape.sequences``
    sequences holding ``fill`` cells."""
    ctx = LlamaContext(model, shape)
    try:
        tokens = model.tokenize("The agent calls a tool and reads its JSON result. " * 8)[:32]
        for pos, token in enumerate(tokens):
            ctx.batch.add(token, pos, 0, want_logits=False)
        ctx.decode()
        ctx.batch.clear()
        fill = min(fill, shape.ctx_per_seq - STEPS - 2)
        state = kv_blob.tile(ctx.state_export(0), fill)
        for seq in range(shape.sequences):
            ctx.state_import(seq, state)
        times = []
        for step in range(STEPS + 1):
            for seq in range(shape.sequences):
                ctx.batch.add(tokens[step % len(tokens)], fill + step, seq, want_logits=True)
            began = time.perf_counter()
            ctx.decode()
            times.append(time.perf_counter() - began)
            ctx.batch.clear()
        return round(statistics.median(times[1:]) * 1000, 2)
    finally:
        ctx.close()


def _key(model: LlamaModel, shape: ContextShape, fill: int) -> str:
    stat = os.stat(model.path)
    what = [model.path, stat.st_size, int(stat.st_mtime), asdict(replace(shape, kv_unified=False))]
    what += [fill, os.cpu_count(), _cpu_model(), llama_cpp.__version__]
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:24]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _read_cache() -> dict:
    try:
        entries = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def _write_cache(key: str, choice: LayoutChoice) -> None:
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        entries = _read_cache()
        entries[key] = {k: v for k, v in asdict(choice).items() if k != "measured"}
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entries, indent=1))
        tmp.replace(path)
    except OSError:
        pass  # a read-only home: measured again next start
