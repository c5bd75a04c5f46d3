"""The llama.cpp settings a node is left to choose, chosen by timing them on this machine.

**KV layout.** With one stream per sequence a decoded token attends only to its own sequence's
cells; with a unified buffer every token attends to all used cells under a mask, but a step's
small matrix products run as one bigger one and prefixes are shared without a copy.

**Flash attention.** On these AVX2 CPUs llama.cpp's flash-attention kernel decodes 1.2-1.5x
slower at agent context lengths (1,000 cells and more a sequence, ``bench/kv_settings.py``) but
1.1-1.4x faster below about 512 cells; on other CPUs it is the faster one throughout.
Without it a prompt whose prefix came from the KV cache is computed in another shape than a
full prefill, so a near-tie can pick another token; a node started ``--repeatable`` keeps it
on and is not offered the choice (``candidates``).

Which is faster depends on the CPU, the model, the thread count, the sequence count and how
full the sequences are (docs/engine.md has figures), so ``measure`` times a decode step of one
token per sequence with every sequence holding ``fill`` cells under each candidate setting,
and the fastest wins. ``fill`` follows the node's traffic: the mean cells a decoded token's
sequence held when this model and shape last served (``remember_traffic``, kept beside the
timings), half a sequence before anything was served. The sequences are filled by loading a
tiled state (``kv_blob.tile``) instead of prefilling them, so a candidate takes a second or
less, and the result is kept in a small JSON file per machine (``cache_path``), keyed by
everything that decides it (llama.cpp's version and the instruction sets it was built with
included: ``llama_build``); delete the file to measure again (a measurement taken on a busy
machine stays until then).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import llama_cpp

from inference.engine import kv_blob
from inference.engine.llama import ContextShape, LlamaContext, LlamaModel, system_info

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
    """Cells per sequence to time at when the node's traffic is not known yet: half of a
    sequence (a session's mean fill over a life that ends with the sequence full), at least 64."""
    return max(64, ctx_per_seq // 2)


def fill_for(model: LlamaModel, shape: ContextShape) -> int:
    """Cells per sequence to time at: where this node's decode steps ran before (the mean
    cells a decoded token's sequence held, ``remember_traffic``) rounded to a power of two
    between 64 and half a sequence, else ``default_fill``. The setting that wins differs on
    either side of a crossover (docs/engine.md: flash attention on below about 512 cells
    here, off above), so a node that serves short chats and one that serves long agent
    sessions should not be timed alike."""
    cells, tokens = remembered_traffic(traffic_key(model, shape))
    if not tokens:
        return default_fill(shape.ctx_per_seq)
    return fill_bucket(cells / tokens, shape.ctx_per_seq)


def fill_bucket(mean_cells: float, ctx_per_seq: int) -> int:
    """``mean_cells`` rounded to the nearest power of two (in log scale), within 64 and
    ``default_fill`` (so the cache file holds a few fills, not one a restart)."""
    nearest = 2 ** round(math.log2(min(max(mean_cells, 1.0), float(ctx_per_seq))))
    return int(min(max(64, nearest), default_fill(ctx_per_seq)))


def traffic_key(model: LlamaModel, shape: ContextShape) -> str:
    """The key of ``shape``'s traffic with ``model`` on this machine in ``TRAFFIC``."""
    return _digest(_machine_and_shape(model, shape))


def remembered_traffic(key: str) -> tuple[int, int]:
    """``(cells, tokens)`` remembered under ``key`` (``traffic_key``); ``(0, 0)`` when none (or
    an entry that is not two integers from 0 to 2**53)."""
    seen = TRAFFIC.entries().get(key)
    if not isinstance(seen, dict):
        return 0, 0
    cells, tokens = seen.get("cells"), seen.get("tokens")
    if not all(isinstance(n, int) and 0 <= n < 2**53 for n in (cells, tokens)):
        return 0, 0
    return cells, tokens


def remember_traffic(key: str, before: tuple[int, int], cells: int, tokens: int) -> None:
    """Remember under ``key`` what was remembered at this run's start (``before``, from
    ``remembered_traffic``) at half its weight, plus this run's ``tokens`` decoded tokens whose
    sequences held ``cells`` cells in all (the latest run weighs most). A run of fewer than
    ``TRAFFIC_MIN_TOKENS`` changes nothing (a node started and stopped at once says nothing of
    its traffic). Never raises (``MeasuredCache.put``)."""
    if tokens >= TRAFFIC_MIN_TOKENS:
        cells, tokens = merged_traffic(before, cells, tokens)
        TRAFFIC.put(key, {"cells": cells, "tokens": tokens})


def merged_traffic(before: tuple[int, int], cells: int, tokens: int) -> tuple[int, int]:
    """``(cells, tokens)``: what was remembered at a run's start (``before``) at half its
    weight plus this run's ``tokens`` decoded tokens whose sequences held ``cells`` cells."""
    return before[0] // 2 + cells, before[1] // 2 + tokens


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
    fill = fill or fill_for(model, shape)
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
    return _digest([*_machine_and_shape(model, shape), [s.name for s in settings], fill])


def _digest(what: list) -> str:
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:24]


def _machine_and_shape(model: LlamaModel, shape: ContextShape) -> list:
    stat = os.stat(model.path)
    neutral = asdict(replace(shape, kv_unified=False, flash_attn="auto"))
    what = [model.path, stat.st_size, int(stat.st_mtime), neutral]
    return [*what, os.cpu_count(), cpu_model(), llama_build()]


def llama_build() -> str:
    """llama-cpp-python's version and the instruction sets its llama.cpp was built with
    (``llama.system_info``): a measurement taken under one build says nothing of another, e.g.
    after ``make install`` adds the AVX-512 sets."""
    return f"{llama_cpp.__version__} {system_info()}"


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

    def __init__(self, name: str, path_env: str = "") -> None:
        self.name = name
        self.path_env = path_env  # an environment variable that, when set, names the file

    @property
    def path(self) -> Path:
        if self.path_env and os.environ.get(self.path_env):
            return Path(os.environ[self.path_env])
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
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps(entries, indent=1))
            tmp.replace(path)
        except OSError:
            pass


CACHE = MeasuredCache("load-tuning.json")
# per model and shape: {"cells", "tokens"}; PHALANX_DECODE_FILL_FILE names another file (the
# benchmarks start each run from none: bench/harness.py)
TRAFFIC = MeasuredCache("decode-fill.json", path_env="PHALANX_DECODE_FILL_FILE")
TRAFFIC_MIN_TOKENS = 256
