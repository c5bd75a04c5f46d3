"""Building a quantized GGUF from another: the file work of a package build (no Django).

Two methods. ``f16`` first dequantizes a quantized source to F16 (``gguf_files``), then has
llama.cpp quantize that F16 file, as it would a model converted from the original weights.
``requantize`` has llama.cpp quantize the quantized source directly (it dequantizes each tensor
to F32 as it goes): no intermediate file. The two differ only by the F16 rounding of the
dequantized values. Either way a quantized source's error stays in the result and the new
type's error adds to it: a build never recovers the original weights, and a type with more
bits than the source can come out worse than the source (Q5_1 from SmolLM2's Q4_1 did).

On a model whose hidden size is not a multiple of 256 (SmolLM2-135M: 576), most tensors cannot
take a K-quant and llama.cpp falls back to another type (``inference.engine.quantize``); the
report counts them so that a build that mostly fell back can be told apart from what it asked.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import tempfile
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.engine.quantize import (
    FALLBACK_LINE,
    QUANT_LADDER,
    TENSOR_LINE,
    QuantizeError,
    quantize,
)
from inference.packages.gguf_files import (
    FLOAT_TYPES,
    GgufFacts,
    atomic_path,
    dequantize_to_f16,
    is_quantized,
    read_facts,
)

METHODS = ("f16", "requantize")
DEQUANTIZE_SHARE = 0.3  # of the progress bar, when the build dequantizes first
LOG_TAIL = 50  # lines of llama.cpp's log kept in the report

Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class BuildReport:
    """What a build made.

    ``requested``: the type asked for (``Q4_K_M``); ``method``: ``f16`` / ``requantize``;
    ``dequantized``: whether an F16 copy was made first; ``source_quantization``: the source's
    file type. Of the output: ``quantization`` (its file type), ``tensor_types`` (ggml type
    name -> tensor count), ``tensor_count``, ``size_bytes``. ``quantized_tensors``: the output's
    tensors in a quantized type (the weights; the F32 norms are not); ``fallback_count``: those
    llama.cpp could not give the type it chose and gave another (``fallback_types``: type ->
    count); ``mostly_fell_back``: more than half of the quantized tensors did. ``seconds``: wall
    time of the whole build. ``log_tail``: the last lines llama.cpp logged.
    """

    requested: str
    method: str
    dequantized: bool
    source_quantization: str
    quantization: str
    tensor_types: dict[str, int]
    tensor_count: int
    quantized_tensors: int
    fallback_count: int
    fallback_types: dict[str, int]
    mostly_fell_back: bool
    size_bytes: int
    seconds: float
    log_tail: list[str]

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (strings, numbers, lists, dicts)."""
        return dataclasses.asdict(self)


def build_quantized(
    source: Path,
    out: Path,
    target: str,
    *,
    method: str = "f16",
    workdir: Path,
    threads: int = 1,
    progress: Progress | None = None,
    log: Callable[[str], None] | None = None,
) -> BuildReport:
    """Write ``out``: the GGUF ``source`` quantized as ``target`` (a key of
    ``QUANT_LADDER``), by ``method`` (``f16``: dequantize to F16 in ``workdir`` first, skipped
    when the source holds only floats; ``requantize``: quantize the source's quantized tensors
    directly). ``threads``: llama.cpp's quantize threads.

    ``progress(fraction, message)``: 0..1 over the whole build (dequantizing takes the first
    30 %, then one step per tensor quantized). ``log(line)``: every line llama.cpp logs, as it
    comes. ``out`` is written only when the build succeeds (it is built in ``workdir``, then
    renamed; copied beside ``out`` first when ``workdir`` is on another file system), and
    replaces a file of that name; what the build wrote in ``workdir`` is removed either way.

    Raises ``QuantizeError`` for an unknown ``target`` or when llama.cpp fails, ``NotGguf`` for
    a ``source`` that is not a readable GGUF, ``ValueError`` for an unknown ``method``,
    ``FileNotFoundError`` when ``out``'s directory does not exist.
    """
    started = time.monotonic()
    source, out = Path(source), Path(out)
    _check_request(target, method, out)
    report = progress or (lambda fraction, message: None)
    report(0.0, f"reading {source.name}")
    facts = read_facts(source)
    dequantize = method == "f16" and not set(facts.tensor_types) <= FLOAT_TYPES
    quantize_log = _QuantizeLog(
        target, DEQUANTIZE_SHARE if dequantize else 0.0, report=report, log=log
    )
    result = _build_in_scratch(
        source,
        out,
        target,
        method=method,
        dequantize=dequantize,
        workdir=workdir,
        threads=threads,
        report=report,
        on_line=quantize_log,
    )
    done = _build_report(
        target, method, dequantize, facts, result, quantize_log, time.monotonic() - started
    )
    report(1.0, f"built {out.name}: {target}, {result.size_bytes / 2**20:.1f} MiB")
    return done


def _check_request(target: str, method: str, out: Path) -> None:
    """Raise before any work: ``QuantizeError`` (unknown ``target``), ``ValueError``
    (unknown ``method``), ``FileNotFoundError`` (no directory for ``out``)."""
    if target not in QUANT_LADDER:
        raise QuantizeError(
            f"unknown quantization type {target!r}: one of {', '.join(QUANT_LADDER)}"
        )
    if method not in METHODS:
        raise ValueError(f"unknown build method {method!r}: one of {', '.join(METHODS)}")
    if not out.parent.is_dir():
        raise FileNotFoundError(
            errno.ENOENT, "no directory for the build's output", str(out.parent)
        )


class _QuantizeLog:
    """llama.cpp's log lines as they come: each passed on to ``log``, the last ``LOG_TAIL``
    kept (``lines``), the tensors that fell back to another type counted by that type
    (``fallbacks``), and each tensor quantized reported as progress after ``start_share``."""

    def __init__(
        self,
        target: str,
        start_share: float,
        *,
        report: Progress,
        log: Callable[[str], None] | None,
    ) -> None:
        self.target = target
        self.start_share = start_share
        self.report = report
        self.log = log
        self.lines: deque[str] = deque(maxlen=LOG_TAIL)
        self.fallbacks: Counter[str] = Counter()

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        if self.log is not None:
            self.log(line)
        if fallback := FALLBACK_LINE.search(line):
            self.fallbacks[fallback.group(3).upper()] += 1
        elif tensor := TENSOR_LINE.match(line):
            done, total, name = int(tensor.group(1)), int(tensor.group(2)), tensor.group(3)
            fraction = self.start_share + (1 - self.start_share) * done / total
            self.report(
                min(fraction, 0.99),
                f"quantizing to {self.target}: tensor {done} of {total} ({name})",
            )


def _build_in_scratch(
    source: Path,
    out: Path,
    target: str,
    *,
    method: str,
    dequantize: bool,
    workdir: Path,
    threads: int,
    report: Progress,
    on_line: Callable[[str], None],
) -> GgufFacts:
    """Dequantize (when asked) and quantize in a scratch directory of ``workdir``, check the
    result and move it to ``out``; the scratch directory is removed either way. Returns the
    facts of the file built."""
    scratch = Path(tempfile.mkdtemp(prefix=f"build-{target}-", dir=workdir))
    try:
        quantize_from = source
        if dequantize:
            quantize_from = scratch / "source-f16.gguf"
            dequantize_to_f16(
                source,
                quantize_from,
                progress=lambda f: report(
                    DEQUANTIZE_SHARE * f, f"dequantizing {source.name} to F16"
                ),
            )
        built = scratch / out.name
        quantize(
            quantize_from,
            built,
            target,
            allow_requantize=method == "requantize",
            threads=threads,
            on_log=on_line,
        )
        report(0.99, f"checking {out.name}")
        result = read_facts(built)
        _move_into_place(built, out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return result


def _build_report(
    target: str,
    method: str,
    dequantize: bool,
    facts: GgufFacts,
    result: GgufFacts,
    quantize_log: _QuantizeLog,
    seconds: float,
) -> BuildReport:
    """The report of a build from ``facts`` (the source) to ``result`` (the output)."""
    fallbacks = quantize_log.fallbacks
    quantized = sum(n for name, n in result.tensor_types.items() if is_quantized(name))
    fallback_count = sum(fallbacks.values())
    return BuildReport(
        requested=target,
        method=method,
        dequantized=dequantize,
        source_quantization=facts.quantization,
        quantization=result.quantization,
        tensor_types=result.tensor_types,
        tensor_count=result.tensor_count,
        quantized_tensors=quantized,
        fallback_count=fallback_count,
        fallback_types=dict(fallbacks.most_common()),
        mostly_fell_back=fallback_count * 2 > quantized,
        size_bytes=result.size_bytes,
        seconds=round(seconds, 3),
        log_tail=list(quantize_log.lines),
    )


def _move_into_place(built: Path, out: Path) -> None:
    try:
        os.replace(built, out)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
        with atomic_path(
            out, mode_from=built
        ) as part:  # workdir on another file system: copy, then rename
            shutil.copyfile(built, part)
