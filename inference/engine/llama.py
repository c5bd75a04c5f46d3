"""The one seam between Phalanx and llama.cpp: thin wrappers over llama-cpp-python's C API.

Everything that touches ``llama_cpp`` ctypes lives here, so the scheduler reads as plain Python
and tests can reason about it. Calls into a ``LlamaContext`` must come from one thread (the
engine's); ``LlamaModel`` tokenization is read-only and safe from any thread.

API reference: llama.cpp ``include/llama.h`` as bound by llama-cpp-python 0.3.36.
"""

from __future__ import annotations

import ctypes
import functools
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import llama_cpp as C
import numpy as np

from inference.engine import kv_blob

_backend_lock = threading.Lock()
_backend_ready = False


class LlamaError(RuntimeError):
    """llama.cpp refused an operation (load, context creation, decode, state restore)."""


def _init_backend() -> None:
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            C.llama_backend_init()
            C.llama_log_set(_silent_log, ctypes.c_void_p(0))
            _backend_ready = True


class _LogLines:
    """One ``capture_log``: llama.cpp logs a line in fragments (a quantize line is three calls);
    this joins them and hands each whole line, without its newline, to ``on_line``."""

    def __init__(self, on_line: Callable[[str], None]) -> None:
        self.on_line = on_line
        self.pending = ""
        self.error: BaseException | None = None

    def feed(self, text: str) -> None:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self.deliver(line)

    def flush(self) -> None:
        if self.pending:
            self.deliver(self.pending)
            self.pending = ""

    def deliver(self, line: str) -> None:
        if self.error is not None:
            return
        try:
            self.on_line(line)
        except BaseException as error:  # raised again when the capture ends, not inside C
            self.error = error


_log_lock = threading.Lock()
_log_sinks: tuple[_LogLines, ...] = ()  # the open captures; replaced, never mutated


@C.llama_log_callback
def _silent_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # llama.cpp logs every tensor at load; keep only errors (GGML_LOG_LEVEL_ERROR == 4).
    message = text.decode("utf-8", "replace")
    for sink in _log_sinks:
        sink.feed(message)
    if level == 4:
        print(message, end="", flush=True)


@contextmanager
def capture_log(on_line: Callable[[str], None]) -> Iterator[None]:
    """Hand every line llama.cpp logs while the block runs to ``on_line`` (the text without
    its newline), through the one log callback this module installs.

    The callback is process-wide: lines that other threads make llama.cpp log meanwhile come
    too. ``on_line`` runs on the thread that logs, inside llama.cpp; an exception it raises
    stops the lines it is given and is raised again when the block ends (llama.cpp's call is
    not interrupted)."""
    global _log_sinks
    _init_backend()
    sink = _LogLines(on_line)
    with _log_lock:
        _log_sinks = (*_log_sinks, sink)
    try:
        yield
    finally:
        with _log_lock:
            _log_sinks = tuple(s for s in _log_sinks if s is not sink)
        sink.flush()
    if sink.error is not None:
        raise sink.error


_system_info_lock = threading.Lock()


@functools.cache
def system_info() -> str:
    """llama.cpp's system info (``llama_print_system_info``): its backends and the instruction
    sets it was built with, ``"CPU : SSE3 = 1 | ... | AVX2 = 1 | AVX512 = 1 | ..."``. Read once
    a process, under a lock: llama.cpp writes that text into one static buffer, which two
    threads (the engine's, a device validation's) must not fill at once."""
    with _system_info_lock:
        return C.llama_print_system_info().decode(errors="replace")


KV_TYPES = {"f16": C.GGML_TYPE_F16, "q8_0": C.GGML_TYPE_Q8_0}
# bytes per value of each K/V cache type: q8_0 stores blocks of 32 values as 32 bytes + an f16
# scale (ggml's block_q8_0)
KV_TYPE_BYTES = {"f16": 2.0, "q8_0": 34 / 32}
FLASH_ATTN = {
    "on": C.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": C.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


def flash_attn_for(choice: str) -> str:
    """``on`` / ``off`` for a context's flash-attention setting; ``auto`` is on (what llama.cpp's
    own ``auto`` picks on these CPUs). The engine resolves ``auto`` before it creates its
    context: timed at load, or on for a repeatable node (``inference.engine.tuning``)."""
    return "on" if choice == "auto" else choice


# "llama_context: flash_attn = enabled", or "= auto" then "Flash Attention enabled" (or
# "... not supported, set to disabled") once llama.cpp resolves it
_FLASH_LINE = re.compile(
    r"flash_attn\s*=\s*(\w+)|Flash Attention (enabled|disabled)|set to (enabled|disabled)"
)
_KV_LINE = re.compile(r"K \((\w+)\):.*V \((\w+)\):")
_UNIFIED_LINE = re.compile(r"kv_unified\s*=\s*(true|false)")


@dataclass(frozen=True)
class ContextSettings:
    """What llama.cpp says it set up for a context (read from its log as it creates it):
    ``flash_attn`` "enabled" / "disabled", ``type_k`` / ``type_v`` ("f16", "q8_0"),
    ``kv_unified`` "true" / "false"."""

    flash_attn: str
    type_k: str
    type_v: str
    kv_unified: str = "unknown"


def _settings_from_log(lines: list[str]) -> ContextSettings:
    text = "\n".join(lines)
    flash = ["".join(groups) for groups in _FLASH_LINE.findall(text)]
    kv = _KV_LINE.search(text)
    unified = _UNIFIED_LINE.search(text)
    return ContextSettings(
        flash_attn=flash[-1] if flash else "unknown",
        type_k=kv.group(1) if kv else "unknown",
        type_v=kv.group(2) if kv else "unknown",
        kv_unified=unified.group(1) if unified else "unknown",
    )


def file_type(name: str) -> int:
    """llama.cpp's ``enum llama_ftype`` value for a file type name (``Q4_K_M`` ->
    ``LLAMA_FTYPE_MOSTLY_Q4_K_M``). Raises ``KeyError`` for a name llama.cpp does not have."""
    value = getattr(C, f"LLAMA_FTYPE_MOSTLY_{name}", None)
    if not isinstance(value, int):
        raise KeyError(name)
    return value


def quantize_model(src: str, dst: str, ftype: int, *, allow_requantize: bool, threads: int) -> int:
    """``llama_model_quantize``: write ``dst``, the model ``src`` with its weights quantized to
    ``ftype`` (llama.cpp picks each tensor's type from it). ``allow_requantize``: quantized
    tensors may be quantized again (else llama.cpp refuses them). ``threads``: worker threads.
    Returns llama.cpp's code, 0 on success; why it failed is in its log (``capture_log``)."""
    _init_backend()
    params = C.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = max(1, threads)
    params.allow_requantize = allow_requantize
    return int(C.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)))


class LlamaModel:
    """A loaded GGUF model: vocabulary, tokenizer and metadata.

    Raises ``LlamaError`` when the file cannot be loaded.
    """

    def __init__(self, path: str, *, mlock: bool = False) -> None:
        _init_backend()
        params = C.llama_model_default_params()
        params.n_gpu_layers = 0
        params.use_mlock = mlock
        self.path = path
        lines: list[str] = []
        with capture_log(lines.append):
            self.ptr = C.llama_model_load_from_file(path.encode(), params)
        if not self.ptr:
            raise LlamaError(f"cannot load model {path}")
        # llama.cpp goes on without the lock when mlock fails, and says so in its log
        refused = [line.strip() for line in lines if "mlock" in line and "fail" in line]
        self.locked = mlock and not refused
        self.lock_refused = refused[0] if mlock and refused else ""
        self.vocab = C.llama_model_get_vocab(self.ptr)
        self.n_vocab = C.llama_vocab_n_tokens(self.vocab)
        self.add_bos = bool(C.llama_vocab_get_add_bos(self.vocab))
        self._pieces: dict[int, bytes] = {}

    def close(self) -> None:
        if self.ptr:
            C.llama_model_free(self.ptr)
            self.ptr = None

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as text, or None when the key is absent."""
        buf = ctypes.create_string_buffer(1 << 16)
        n = C.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return None if n < 0 else buf.value.decode("utf-8", "replace")

    def token_text(self, token: int) -> str:
        return self.piece(token, special=True).decode("utf-8", "replace")

    @property
    def bos_token(self) -> str:
        return self.token_text(C.llama_vocab_bos(self.vocab))

    @property
    def eos_token(self) -> str:
        return self.token_text(C.llama_vocab_eos(self.vocab))

    @property
    def bos_id(self) -> int:
        """The id of the beginning-of-sequence token (-1 when the vocabulary has none)."""
        return C.llama_vocab_bos(self.vocab)

    def tokenize(
        self, text: str, *, add_special: bool = False, parse_special: bool = True
    ) -> list[int]:
        """Token ids of ``text``; special tokens written in the text (``<|im_start|>``) are parsed."""
        raw = text.encode("utf-8")
        capacity = len(raw) + 8
        buf = (C.llama_token * capacity)()
        n = C.llama_tokenize(self.vocab, raw, len(raw), buf, capacity, add_special, parse_special)
        if n < 0:
            capacity = -n
            buf = (C.llama_token * capacity)()
            n = C.llama_tokenize(
                self.vocab, raw, len(raw), buf, capacity, add_special, parse_special
            )
        return list(buf[:n])

    def piece(self, token: int, *, special: bool = False) -> bytes:
        """The bytes a token stands for (possibly part of a UTF-8 character)."""
        key = token if not special else -1 - token
        cached = self._pieces.get(key)
        if cached is not None:
            return cached
        buf = ctypes.create_string_buffer(64)
        n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        value = buf.raw[:n]
        self._pieces[key] = value
        return value

    def max_token_bytes(self) -> int:
        """The longest piece any token stands for, in bytes (special tokens' text included):
        a text of ``n`` bytes makes at least ``n / max_token_bytes()`` tokens."""
        buf = ctypes.create_string_buffer(256)
        longest = 1
        for token in range(self.n_vocab):
            n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
            longest = max(longest, abs(n))
        return longest

    def control_token_texts(self) -> tuple[str, ...]:
        """The texts of the vocabulary's control and user-defined tokens (``<|im_end|>`` ...):
        written in a prompt, they tokenize as those tokens, not as text."""
        texts = []
        for token in range(self.n_vocab):
            attr = C.llama_vocab_get_attr(self.vocab, token)
            if (
                C.llama_vocab_is_control(self.vocab, token)
                or attr & C.LLAMA_TOKEN_ATTR_USER_DEFINED
            ):
                text = self.piece(token, special=True).decode("utf-8", "replace")
                if text.strip():
                    texts.append(text)
        return tuple(texts)

    def is_eog(self, token: int) -> bool:
        return bool(C.llama_vocab_is_eog(self.vocab, token))

    def kv_bytes_per_token(self, kv_type: str = "f16") -> int:
        """Bytes of K and V per token over all layers
        (2 * n_layer * n_embd_kv * ``KV_TYPE_BYTES[kv_type]``)."""
        n_layer = C.llama_model_n_layer(self.ptr)
        n_embd = C.llama_model_n_embd(self.ptr)
        n_head = max(1, C.llama_model_n_head(self.ptr))
        n_head_kv = C.llama_model_n_head_kv(self.ptr) or n_head
        return round(2 * n_layer * (n_embd // n_head * n_head_kv) * KV_TYPE_BYTES[kv_type])


@dataclass(frozen=True)
class ContextShape:
    """How a context is sized: ``sequences`` sequences of ``ctx_per_seq`` tokens each."""

    sequences: int
    ctx_per_seq: int
    n_batch: int = 512
    threads: int = 1
    kv_unified: bool = False
    kv_type: str = "f16"  # a key of KV_TYPES, for both K and V
    flash_attn: str = "auto"  # "auto" (flash_attn_for), "on" or "off"


class LlamaContext:
    """One llama.cpp context holding several sequences, each in its own KV stream."""

    def __init__(self, model: LlamaModel, shape: ContextShape) -> None:
        params = C.llama_context_default_params()
        params.n_ctx = shape.sequences * shape.ctx_per_seq
        params.n_batch = shape.n_batch
        params.n_ubatch = shape.n_batch
        params.n_seq_max = shape.sequences
        params.n_threads = shape.threads
        params.n_threads_batch = shape.threads
        # Default: one KV stream per sequence, so a token attends only to its own sequence's
        # cells. A unified cache makes every token attend to all used cells (masked): faster for
        # short sequences, slower for long agent sessions (docs/engine.md has the figures).
        params.kv_unified = shape.kv_unified
        params.type_k = params.type_v = KV_TYPES[shape.kv_type]
        params.flash_attn_type = FLASH_ATTN[flash_attn_for(shape.flash_attn)]
        params.no_perf = True
        self.model = model
        self.shape = shape
        self.ptr, log = _create_context(model, params)
        if not self.ptr:
            errors = [line.strip() for line in log if "init_from_model" in line]
            raise LlamaError("cannot create llama context: " + ("; ".join(errors) or "no reason"))
        self.settings = _settings_from_log(log)
        self.memory = C.llama_get_memory(self.ptr)
        self.batch = TokenBatch(shape.n_batch)
        self.llama_s = 0.0  # seconds spent inside llama_decode and llama_sampler_sample

    def close(self) -> None:
        self.batch.close()
        if self.ptr:
            C.llama_free(self.ptr)
            self.ptr = None

    def decode(self) -> None:
        """Run the pending batch. Raises ``LlamaError`` when llama.cpp cannot place it."""
        if self.batch.size == 0:
            return
        started = time.perf_counter()
        rc = C.llama_decode(self.ptr, self.batch.raw)
        self.llama_s += time.perf_counter() - started
        if rc != 0:
            raise LlamaError(f"llama_decode failed with code {rc} for {self.batch.size} tokens")

    def seq_truncate(self, seq_id: int, keep: int) -> None:
        """Drop every cell of ``seq_id`` at position ``keep`` and beyond (``keep=0``: all)."""
        C.llama_memory_seq_rm(self.memory, seq_id, keep, -1)

    def seq_share(self, src: int, dst: int, count: int) -> None:
        """Give ``dst`` the first ``count`` cells of ``src``.

        In a unified cache the cells are shared (``llama_memory_seq_cp``, no copy). With one
        stream per sequence llama.cpp copies across streams only whole buffers, so the copy goes
        through the per-sequence state (only the used cells), then is truncated."""
        if self.shape.kv_unified:
            self.seq_truncate(dst, 0)
            C.llama_memory_seq_cp(self.memory, src, dst, 0, count)
            return
        self.state_import(dst, self.state_export(src))
        self.seq_truncate(dst, count)

    def clear(self) -> None:
        """Empty the whole KV cache (every sequence)."""
        C.llama_memory_clear(self.memory, True)

    def state_export(self, seq_id: int) -> bytes:
        """The KV state of one sequence, as llama.cpp serializes it."""
        size = C.llama_state_seq_get_size(self.ptr, seq_id)
        buf = (ctypes.c_uint8 * size)()
        written = C.llama_state_seq_get_data(self.ptr, buf, size, seq_id)
        # string_at copies the bytes in C; slicing the ctypes array would build a list of ints
        # first (48 MiB/s here, against 1.3 GiB/s: bench/kv_copy.py)
        return ctypes.string_at(buf, written)

    def state_import(self, seq_id: int, blob: bytes) -> None:
        """Load a state from ``state_export`` into ``seq_id`` (which is cleared first), also one
        exported by a context of the other KV layout. Raises ``LlamaError`` when llama.cpp
        refuses it (another model, cache type or flash-attention setting)."""
        try:
            blob = kv_blob.with_stream_count(
                blob, 1 if self.shape.kv_unified else self.shape.sequences
            )
        except kv_blob.UnsplittableState:
            pass  # a state kv_blob cannot read goes to llama.cpp as it is
        self.seq_truncate(seq_id, 0)
        buf = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
        if C.llama_state_seq_set_data(self.ptr, buf, len(blob), seq_id) == 0:
            raise LlamaError(f"llama_state_seq_set_data refused {len(blob)} bytes")

    def sample(self, sampler: C.llama_sampler_p, batch_index: int) -> int:
        """Sample (and accept) a token from the logits at ``batch_index`` of the last decode."""
        started = time.perf_counter()
        token = C.llama_sampler_sample(sampler, self.ptr, batch_index)
        self.llama_s += time.perf_counter() - started
        return token

    def output_logits(self) -> np.ndarray:
        """The logits of the last decode, one row per token that the batch (as decoded, before
        it is cleared) added with ``want_logits``, in batch order: float32, shape
        ``(rows, n_vocab)``, a copy (the next decode overwrites llama.cpp's buffer). Raises
        ``LlamaError`` when the decode kept none."""
        raw = self.batch.raw
        rows = sum(1 for i in range(self.batch.size) if raw.logits[i])
        ptr = C.llama_get_logits(self.ptr)
        if rows == 0 or not ptr:
            raise LlamaError("the last decode kept no logits")
        return np.ctypeslib.as_array(ptr, shape=(rows, self.model.n_vocab)).copy()


_create_lock = threading.Lock()


def _create_context(model: LlamaModel, params) -> tuple[object, list[str]]:
    """``llama_init_from_model`` and the lines llama.cpp logged while it ran."""
    lines: list[str] = []
    with _create_lock, capture_log(lines.append):  # one context at a time: its lines only
        ptr = C.llama_init_from_model(model.ptr, params)
    return ptr, lines


class TokenBatch:
    """A reusable ``llama_batch`` that tokens of several sequences are appended to."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.raw = C.llama_batch_init(capacity, 0, 1)
        self.size = 0

    def close(self) -> None:
        C.llama_batch_free(self.raw)

    @property
    def room(self) -> int:
        return self.capacity - self.size

    def clear(self) -> None:
        self.size = 0
        self.raw.n_tokens = 0

    def add(self, token: int, pos: int, seq_id: int, want_logits: bool) -> int:
        """Append one token; returns its index in the batch (used to sample its logits)."""
        i = self.size
        raw = self.raw
        raw.token[i] = token
        raw.pos[i] = pos
        raw.n_seq_id[i] = 1
        raw.seq_id[i][0] = seq_id
        raw.logits[i] = want_logits
        self.size = i + 1
        raw.n_tokens = self.size
        return i
