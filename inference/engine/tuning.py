"""The llama.cpp settings a node is left to choose, chosen by timing them on this machine.

**KV layout.** With one stream per sequence a decoded token attends only to its own sequence's
cells; with a unified buffer every token attends to all used cells under a mask, but a step's
small matrix products run as one bigger one and prefixes are shared without a copy.

**Flash attention.** On these AVX2 CPUs llama.cpp's flash-attention kernel decodes 1.45-1.76x
slower at agent context lengths (``bench/kv_settings.py``), on other CPUs it is the faster one.
Without it a prompt whose prefix came from the KV cache is computed in another shape than a
full prefill, so a near-tie can pick another token; a node started ``--repeatable`` keeps it
on and is not offered the choice (``candidates``).

Which is faster depends on the CPU, the model, the thread count, the sequence count and how
full the sequences are (docs/engine.md has figures), so ``measure`` times a decode step of one
token per sequence with every sequence holding ``fill`` cells under each candidate setting,
and the fastest wins. The sequences are filled by loading a tiled state (``kv_blob.tile``)
instead of prefilling them, so a candidate takes a second or less, and the result is kept in a
small JSON file per machine (``cache_path``), keyed by everything that decides it (llama.cpp's
version included); delete the file to measure again (a measurement taken on a busy machine
stays until then).
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

STEPS = 5  # timed decode steps per candidate (the median is kept), after one untimed


@dataclass(frozen=True)
class Setting:
    """One candidate: the KV layout and flash attention ("on" / "off")."""

    unified: bool
    flash_attn: str

    @property
    def name(self) -> str:
        return f"{'unified' if self.unified else 'split'}+fa-{self.flash_attn}"


@dataclass(frozen=True)
class Tuning:
    """The setting picked and the step time (ms) of each candidate, by ``Setting.name``, at
    ``fill`` cells per sequence."""

    unified: bool
    flash_attn: str
    step_ms: dict[str, float]
    fill: int
    measured: bool = True  # False when read from the cache file


def candidates(unified: bool | None, flash_attn: str) -> list[Setting]:
    """The settings to time: both layouts when ``unified`` is None (else the one given), both
    flash-attention settings when ``flash_attn`` is "auto" (else the one given)."""
    layouts = [False, True] if unified is None else [unified]
    flashes = ["on", "off"] if flash_attn == "auto" else [flash_attn]
    return [Setting(layout, flash) for layout in layouts for flash in flashes]


def default_fill(ctx_per_seq: int) -> int:
    """Cells per sequence to time at: half of a sequence (a session's mean fill over a life
    that ends with the sequence full), at least 64."""
    return max(64, ctx_per_seq // 2)


def cache_path() -> Path:
    return CACHE.path


def choose(
    model: LlamaModel, shape: ContextShape, settings: list[Setting], fill: int | None = None
) -> Tuning:
    """The fastest of ``settings`` for ``shape`` (its ``kv_unified`` and ``flash_attn``
    ignored), from the cache file when this machine measured the same choice before. Raises
    ``LlamaError`` when a context cannot be created, ``ValueError`` when ``settings`` is empty
    or the model's state cannot be tiled (``kv_blob``)."""
    if not settings:
        raise ValueError("no setting to choose from")
    fill = fill or default_fill(shape.ctx_per_seq)
    key = _key(model, shape, settings, fill)
    cached = CACHE.entries().get(key)
    try:
        return Tuning(**{**cached, "measured": False})
    except TypeError:  # none, or written by another version: measured again
        pass
    tuning = measure(model, shape, settings, fill)
    CACHE.put(key, {k: v for k, v in asdict(tuning).items() if k != "measured"})
    return tuning


def measure(model: LlamaModel, shape: ContextShape, settings: list[Setting], fill: int) -> Tuning:
    times = {
        s.name: step_ms(model, replace(shape, kv_unified=s.unified, flash_attn=s.flash_attn), fill)
        for s in settings
    }
    best = min(settings, key=lambda s: times[s.name])
    return Tuning(unified=best.unified, flash_attn=best.flash_attn, step_ms=times, fill=fill)


def step_ms(model: LlamaModel, shape: ContextShape, fill: int) -> float:
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


def _key(model: LlamaModel, shape: ContextShape, settings: list[Setting], fill: int) -> str:
    stat = os.stat(model.path)
    neutral = asdict(replace(shape, kv_unified=False, flash_attn="auto"))
    what = [model.path, stat.st_size, int(stat.st_mtime), neutral, [s.name for s in settings]]
    what += [fill, os.cpu_count(), cpu_model(), llama_cpp.__version__]
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:24]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


class MeasuredCache:
    """A JSON file of measurements under ``~/.cache/phalanx/`` (``$XDG_CACHE_HOME``), one
    entry a key (a hash of everything that decides the figures); written whole and renamed,
    so a reader never sees half a file. A file that cannot be read is empty; one that cannot
    be written is not (a read-only home measures again next time)."""

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def path(self) -> Path:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(base) / "phalanx" / self.name

    def entries(self) -> dict:
        try:
            entries = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return entries if isinstance(entries, dict) else {}

    def put(self, key: str, value) -> None:
        path = self.path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            entries = {**self.entries(), key: value}
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(entries, indent=1))
            tmp.replace(path)
        except OSError:
            pass


CACHE = MeasuredCache("load-tuning.json")
