"""Perplexity of a text under a GGUF model, computed with llama.cpp (through ``llama.py``).

The tokens (with a BOS first when the model adds one) are evaluated in windows of ``n_ctx``
tokens that overlap by half (a stride of ``n_ctx / 2``), each window in a fresh KV cache. The
first window scores every token after its first; each later window scores only its second
half, with the first half as context, as llama.cpp's ``tools/perplexity`` scores its chunks.
Unlike that tool (chunks that do not overlap, so their first halves are never scored, and at
least ``2 * n_ctx`` tokens of text), every token after the first is scored exactly once, so any
text of 2 tokens or more has a figure; figures compare between models measured here, not with
the tool's published ones. As the tool does, a later window's first token is replaced by BOS
when the model adds one (it is context there, not scored).

Attention runs without flash attention: on these CPUs llama.cpp's flash-attention kernel keeps
F16 intermediates, which moved SmolLM2-135M's figure on a short paragraph by 0.5 % (21.81
against 21.70, the figure llama-cpp-python's ``Llama(logits_all=True)`` gives): half the gap
between that model's F16 and Q8_0 builds (17.72 and 17.89 on a longer text), which is the kind
of difference this figure is for.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inference.engine.llama import ContextShape, LlamaContext, LlamaModel


@dataclass(frozen=True)
class PerplexityResult:
    """``perplexity``: exp of the mean negative log-likelihood (nats) per scored token;
    ``tokens``: how many tokens were scored (all but the first); ``seconds``: wall time of the
    whole call, loading the model included."""

    perplexity: float
    tokens: int
    seconds: float


def perplexity(
    gguf_path: Path | str, text: str, *, n_ctx: int = 512, threads: int = 1
) -> PerplexityResult:
    """The perplexity of ``text`` under the model at ``gguf_path``, in windows of ``n_ctx``
    tokens (see the module docstring). The model and context are freed before it returns.

    Raises ``ValueError`` when ``n_ctx`` < 2 or the text makes fewer than 2 tokens,
    ``LlamaError`` when llama.cpp cannot load the model or evaluate a window."""
    if n_ctx < 2:
        raise ValueError(f"n_ctx must be at least 2, not {n_ctx}")
    started = time.monotonic()
    model = LlamaModel(str(gguf_path))
    try:
        tokens = model.tokenize(text, add_special=True, parse_special=False)
        if len(tokens) < 2:
            raise ValueError(f"the text makes {len(tokens)} token(s); perplexity needs 2")
        shape = ContextShape(
            sequences=1, ctx_per_seq=n_ctx, n_batch=n_ctx, threads=threads, flash_attn="off"
        )
        context = LlamaContext(model, shape)
        try:
            nll = _total_nll(context, tokens, n_ctx, model.bos_id if model.add_bos else None)
        finally:
            context.close()
    finally:
        model.close()
    scored = len(tokens) - 1
    return PerplexityResult(
        perplexity=math.exp(nll / scored),
        tokens=scored,
        seconds=time.monotonic() - started,
    )


def _total_nll(context: LlamaContext, tokens: list[int], n_ctx: int, bos: int | None) -> float:
    """The summed negative log-likelihood (nats) of ``tokens[1:]``, window by window."""
    stride = n_ctx // 2
    total = 0.0
    scored_to = 1  # the next token to score
    begin = 0
    while scored_to < len(tokens):
        end = min(begin + n_ctx, len(tokens))
        window = tokens[begin:end]
        if begin > 0 and bos is not None:
            window[0] = bos
        context.clear()
        context.batch.clear()
        for i, token in enumerate(window):
            # the logits at position p predict token p + 1: keep those that predict scored tokens
            context.batch.add(token, i, 0, want_logits=scored_to - 1 <= begin + i < end - 1)
        context.decode()
        total += _nll(context.output_logits(), np.asarray(tokens[scored_to:end]))
        scored_to = end
        begin += stride
    return total


def _nll(logits: np.ndarray, targets: np.ndarray) -> float:
    """Summed -log softmax(logits)[target] over the rows of ``logits`` (rows, n_vocab) float32,
    a few rows at a time (the temporaries stay small with a large vocabulary)."""
    total = 0.0
    for first in range(0, len(targets), 64):
        rows = logits[first : first + 64]
        peak = rows.max(axis=1)
        sums = np.exp(rows - peak[:, None]).sum(axis=1, dtype=np.float64)
        picked = rows[np.arange(len(rows)), targets[first : first + 64]]
        total += float((peak.astype(np.float64) + np.log(sums) - picked).sum())
    return total
