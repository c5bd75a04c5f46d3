"""llama.cpp's quantizer (``llama_model_quantize``, through ``inference/engine/llama.py``).

llama.cpp picks each tensor's type from the requested file type: the K-quant mixes
(``Q4_K_M`` ...) give some tensors more bits, and a tensor whose row length is not a multiple
of the type's block (256 for the K-quants) falls back to a type whose block fits; it logs one
warning line per such tensor (``src/llama-quant.cpp``, ``tensor_type_fallback``)::

    warning: blk.0.attn_k.weight - ncols 576 not divisible by 256 (required for type q4_K) -> falling back to q5_0

and one line per tensor as it writes it::

    [  12/ 272] blk.1.attn_k.weight - [  576,   192,     1,     1], type =   q4_1, converting to q5_0 .. size = ...
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from inference.engine import llama

# The file types a package can be built as, from most to fewest bits per weight (ordered by the
# sizes llama.cpp's tools/quantize lists for Llama-3-8B: Q8_0 7.96 GB, Q6_K 6.14, Q5_1 5.65,
# Q5_K_M 5.33, Q5_0 5.21, Q5_K_S 5.21, Q4_1 4.78, Q4_K_M 4.58, Q4_K_S 4.37, Q4_0 4.34,
# Q3_K_L 4.03, Q3_K_M 3.74, Q3_K_S 3.41, Q2_K 2.96), name -> llama.cpp's ``llama_ftype``.
QUANT_LADDER: dict[str, int] = {
    name: llama.file_type(name)
    for name in (
        "F16",
        "Q8_0",
        "Q6_K",
        "Q5_1",
        "Q5_K_M",
        "Q5_0",
        "Q5_K_S",
        "Q4_1",
        "Q4_K_M",
        "Q4_K_S",
        "Q4_0",
        "Q3_K_L",
        "Q3_K_M",
        "Q3_K_S",
        "Q2_K",
    )
}

# "[  12/ 272] blk.1.attn_k.weight - [...], type = ..." -> (12, 272, name)
TENSOR_LINE = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]\s+(\S+)")
# "warning: NAME - ncols 576 not divisible by 256 (required for type q4_K) -> falling back to q5_0"
FALLBACK_LINE = re.compile(
    r"warning: (\S+)\s+- ncols\s+\d+ not divisible by\s+\d+ \(required for type\s+(\S+)\).*"
    r"-> falling back to\s+(\S+)"
)
_FAILED_LINE = re.compile(r"failed to quantize: (.+)")


class QuantizeError(RuntimeError):
    """The quantization was not done: an unknown type name, or llama.cpp failed (the message
    carries llama.cpp's reason, e.g. ``requantizing from type q4_1 is disabled``)."""


def quantize(
    src: Path | str,
    dst: Path | str,
    type_name: str,
    *,
    allow_requantize: bool,
    threads: int,
    on_log: Callable[[str], None] | None = None,
) -> list[str]:
    """Quantize the GGUF ``src`` into ``dst`` as ``type_name`` (a key of ``QUANT_LADDER``).

    ``allow_requantize``: quantized tensors of ``src`` may be quantized again (dequantized
    first; each error adds to the last); without it, llama.cpp accepts only F32 / F16 / BF16
    weights. ``threads``: llama.cpp's worker threads. ``on_log(line)`` sees each line llama.cpp
    logs meanwhile, as it comes (``inference.engine.llama.capture_log``; lines other threads
    make llama.cpp log come too).

    Returns the lines llama.cpp logged. Raises ``QuantizeError`` for an unknown ``type_name``
    (nothing is written) or when llama.cpp fails; ``dst``, written in place by llama.cpp, is
    removed then.
    """
    ftype = QUANT_LADDER.get(type_name)
    if ftype is None:
        raise QuantizeError(
            f"unknown quantization type {type_name!r}: one of {', '.join(QUANT_LADDER)}"
        )
    lines: list[str] = []

    def on_line(line: str) -> None:
        lines.append(line)
        if on_log is not None:
            on_log(line)

    dst = Path(dst)
    try:
        with llama.capture_log(on_line):
            code = llama.quantize_model(
                str(src), str(dst), ftype, allow_requantize=allow_requantize, threads=threads
            )
    except BaseException:
        dst.unlink(missing_ok=True)
        raise
    if code != 0:
        dst.unlink(missing_ok=True)
        reasons = [m.group(1).strip() for line in lines if (m := _FAILED_LINE.search(line))]
        reason = reasons[-1] if reasons else f"llama_model_quantize returned {code}"
        raise QuantizeError(
            f"llama.cpp could not quantize {Path(src).name} to {type_name}: {reason}"
        )
    return lines
