"""Which quantization type serves fastest on this CPU: the decode step of 1 and of 8 tokens,
timed per type (issue 34, "batching that pays"). No Django.

llama.cpp's CPU kernels differ by type far more than the bits per weight say: on AVX2 CPUs the
types with repacked kernels (Q4_0 as ``q4_0_8x8``; Q4_K where a tensor's rows allow) run a
batch of 8 tokens through one pass over the weights, while Q4_1's cost nearly as much per
token in a batch as alone. So the type a package is built as decides both the single-stream
speed and what continuous batching buys, and it is measured, not assumed: each candidate type
is made from the source by llama.cpp's quantizer in a scratch directory (requantized: the
kernels and the bytes are the type's, whatever the values' error; the file is only timed and
then removed), loaded, and a decode step is timed with one sequence holding one token and with
8 sequences holding one each, every sequence ``FILL`` cells full (``tuning.step_ms``: filled
by a tiled state, median of 5 steps).

The pick (``fastest``) is the type with the most tokens/s at 8 streams, the aggregate that
batching is for (within 5 %, the faster single stream); the batch gain alone (8 streams over
1) would reward a type whose single token is slow. Measured here (2-core AVX2, 2 threads):
Q8_0 293 tok/s at 8 (143 at 1), Q4_0 288 (177), Q5_0 246, Q4_K_M 235, Q4_1 187 (115): Q4_0. The source's own type stays unless another beats it by ``MIN_GAIN``. Results
are kept per source file, CPU, thread count and llama.cpp version in
``~/.cache/phalanx/serving-types.json`` (delete it to measure again).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from inference.engine import tuning
from inference.engine.llama import ContextShape, LlamaModel
from inference.engine.quantize import quantize
from inference.packages.gguf_files import read_facts

# the types tried: from 8 down to 4 bits, the ones with CPU kernels of their own (the K-quant
# mixes fall back to Q5_0 / Q8_0 on tensors whose rows are not a multiple of 256)
CANDIDATES = ("Q8_0", "Q5_0", "Q4_K_M", "Q4_1", "Q4_0")
FILL = 128  # cells per sequence when timed: an agent turn's short context
BATCH = 8  # streams of the batched step
MIN_GAIN = 1.10  # another type must beat the source's by this much at BATCH streams
TIE = 1.05  # types this close to the best at BATCH streams are a tie, broken at 1 stream


@dataclass(frozen=True)
class TypeSpeed:
    """One type's decode step: ``step_1_ms`` (one token of one sequence), ``step_8_ms`` (one
    token each of ``BATCH`` sequences); ``tokens_per_s_1`` / ``tokens_per_s_8`` the same as
    rates; ``batch_gain`` = tokens_per_s_8 / tokens_per_s_1; ``size_bytes`` of the file."""

    quantization: str
    step_1_ms: float
    step_8_ms: float
    size_bytes: int

    @property
    def tokens_per_s_1(self) -> float:
        return 1000 / self.step_1_ms

    @property
    def tokens_per_s_8(self) -> float:
        return BATCH * 1000 / self.step_8_ms

    @property
    def batch_gain(self) -> float:
        return self.tokens_per_s_8 / self.tokens_per_s_1

    def as_dict(self) -> dict:
        rates = {
            "tokens_per_s_1": round(self.tokens_per_s_1, 1),
            "tokens_per_s_8": round(self.tokens_per_s_8, 1),
            "batch_gain": round(self.batch_gain, 2),
        }
        return {**asdict(self), **rates}


def source_type(path: Path) -> str:
    """The file type of the GGUF at ``path`` as ``QUANT_LADDER`` names it (``Q4_1``)."""
    return read_facts(path).quantization.upper()


def measure_types(
    source: Path, *, threads: int, candidates: tuple[str, ...] = CANDIDATES
) -> list[TypeSpeed]:
    """Each of ``candidates`` (keys of ``quantize.QUANT_LADDER``) timed as made from ``source``, from
    the cache file when this machine timed the same before. Raises ``QuantizeError`` when
    llama.cpp cannot make a type, ``LlamaError`` when it cannot load or decode it."""
    source = Path(source)
    key = _key(source, threads, candidates)
    cached = CACHE.entries().get(key)
    try:
        return [TypeSpeed(**entry) for entry in cached]
    except TypeError:  # none, or written by another version
        pass
    own = source_type(source)
    speeds = []
    with tempfile.TemporaryDirectory(prefix="serving-type-") as scratch:
        for name in candidates:
            if name == own:
                speeds.append(_time(source, name, threads))
                continue
            made = Path(scratch) / f"{name}.gguf"
            quantize(source, made, name, allow_requantize=True, threads=threads)
            speeds.append(_time(made, name, threads))
            made.unlink()
    CACHE.put(key, [asdict(s) for s in speeds])
    return speeds


def faster_than(speeds: list[TypeSpeed], own: str) -> list[TypeSpeed]:
    """The types that beat the source's own (``own``) by ``MIN_GAIN`` in tokens/s at
    ``BATCH`` streams, best first: the most tokens/s at ``BATCH`` streams, where types within
    ``TIE`` of the best are a tie broken by tokens/s at 1 stream (a difference of a few
    percent is a timing's noise)."""
    mine = next((s.tokens_per_s_8 for s in speeds if s.quantization == own), 0.0)
    pool = [s for s in speeds if s.quantization != own and s.tokens_per_s_8 >= MIN_GAIN * mine]
    ordered = []
    while pool:
        top = max(s.tokens_per_s_8 for s in pool)
        best = max((s for s in pool if s.tokens_per_s_8 * TIE >= top), key=_single)
        ordered.append(best)
        pool.remove(best)
    return ordered


def fastest(speeds: list[TypeSpeed], own: str) -> TypeSpeed:
    """The type to serve: the first of ``faster_than``, else the source's own. Raises
    ``ValueError`` when ``own`` was not timed and nothing beats it."""
    ahead = faster_than(speeds, own)
    if ahead:
        return ahead[0]
    mine = [s for s in speeds if s.quantization == own]
    if not mine:
        raise ValueError(f"{own} was not timed")
    return mine[0]


def _single(speed: TypeSpeed) -> float:
    return speed.tokens_per_s_1


def _time(path: Path, name: str, threads: int) -> TypeSpeed:
    model = LlamaModel(str(path))
    try:
        one = tuning.step_ms(model, ContextShape(1, 2 * FILL, threads=threads), FILL)
        batch = tuning.step_ms(model, ContextShape(BATCH, 2 * FILL, threads=threads), FILL)
    finally:
        model.close()
    return TypeSpeed(name, one, batch, path.stat().st_size)


CACHE = tuning.MeasuredCache("serving-types.json")


def cache_path() -> Path:
    return CACHE.path


def _key(source: Path, threads: int, candidates: tuple[str, ...]) -> str:
    stat = source.stat()
    what = [str(source.resolve()), stat.st_size, int(stat.st_mtime), threads, list(candidates)]
    what += [FILL, BATCH, os.cpu_count(), tuning.cpu_model(), tuning.llama_build()]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:24]
