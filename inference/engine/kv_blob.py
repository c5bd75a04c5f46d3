"""Split one sequence's KV state at a position, and join the parts back: shared prefixes in host RAM.

``llama_state_seq_get_data`` writes a sequence's KV cells in llama.cpp's state format (llama.cpp
``src/llama-context.cpp`` ``state_seq_get_data`` and ``src/llama-kv-cache.cpp`` ``state_write`` /
``state_write_meta`` / ``state_write_data``, as vendored in llama-cpp-python 0.3.36)::

    u32 magic (0xaf143cd8), i32 seq_id (ignored on load)
    u32 n_stream
    per stream: u32 cell_count, then when cell_count > 0:
        per cell:  i32 pos, u32 n_seq_id (1), i32 seq_id
        u32 v_trans, u32 n_layer
        per layer: i32 k_type, u64 k_row_bytes, cell_count rows of K
        v_trans 0: per layer: i32 v_type, u64 v_row_bytes, cell_count rows of V
        v_trans 1: per layer: i32 v_type, u32 element_bytes, u32 n_embd_v,
                   n_embd_v runs of cell_count elements (V stored transposed)

``split`` cuts such a state into the cells before a position (a prefix many sessions share, kept
once) and the cells from it on (the session's own part); ``join`` puts a prefix and a suffix back
into one state that ``llama_state_seq_set_data`` loads. Only the plain cache of that format is
handled: a state with more than one section (sliding-window models write two caches), with
per-cell extras (M-RoPE) or without V tensors (MLA) does not parse to the byte and raises
``UnsplittableState``; callers then keep such states whole.

``with_stream_count`` rewrites the stream count a state was written with (1 from a unified
cache, the sequence count from one stream per sequence): llama.cpp refuses a state written by
a context of the other layout, though the cells are stored alike.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
MAGIC = 0xAF143CD8
_CELL = np.dtype([("pos", "<i4"), ("n_seq_id", "<u4"), ("seq_id", "<i4")])


class UnsplittableState(ValueError):
    """The bytes are not a single plain KV-cache state of one sequence."""


@dataclass
class _Layer:
    type_id: int
    row_bytes: int  # bytes of one cell's row (K, or V when not transposed)
    data: np.ndarray  # K or V rows: (cells, row_bytes); transposed V: (n_embd_v, cells, el)


@dataclass
class _State:
    seq_id: int
    n_stream: int
    cells: np.ndarray  # _CELL records
    v_trans: int
    keys: list[_Layer]
    values: list[_Layer]


class _Reader:
    def __init__(self, data: bytes | memoryview) -> None:
        self.data = memoryview(data)
        self.at = 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.at + n > len(self.data):
            raise UnsplittableState(f"state ends early: {n} bytes wanted at offset {self.at}")
        chunk = self.data[self.at : self.at + n]
        self.at += n
        return chunk

    def unpack(self, fmt: struct.Struct) -> int:
        return fmt.unpack(self.take(fmt.size))[0]


def _parse(blob: bytes) -> _State:
    r = _Reader(blob)
    if r.unpack(_U32) != MAGIC:
        raise UnsplittableState("not a llama.cpp sequence state (bad magic)")
    seq_id = r.unpack(_I32)
    n_stream = r.unpack(_U32)
    if not 1 <= n_stream <= 4096:
        raise UnsplittableState(f"implausible stream count {n_stream}")
    state = None
    for _ in range(n_stream):
        count = r.unpack(_U32)
        if count == 0:
            continue
        if state is not None:
            raise UnsplittableState("cells in more than one stream")
        state = _parse_stream(r, seq_id, n_stream, count)
    if r.at != len(r.data):
        raise UnsplittableState(f"{len(r.data) - r.at} bytes after the state (a second cache?)")
    if state is None:
        return _State(seq_id, n_stream, np.zeros(0, _CELL), 0, [], [])
    return state


def _parse_stream(r: _Reader, seq_id: int, n_stream: int, count: int) -> _State:
    cells = np.frombuffer(r.take(count * _CELL.itemsize), dtype=_CELL).copy()
    if (cells["n_seq_id"] != 1).any():
        raise UnsplittableState("cells shared by several sequences (not a one-sequence state)")
    v_trans = r.unpack(_U32)
    n_layer = r.unpack(_U32)
    if v_trans not in (0, 1) or not 1 <= n_layer <= 4096:
        raise UnsplittableState(f"implausible header v_trans={v_trans} n_layer={n_layer}")
    keys = [_rows(r, count) for _ in range(n_layer)]
    values = [_rows(r, count) if not v_trans else _columns(r, count) for _ in range(n_layer)]
    return _State(seq_id, n_stream, cells, v_trans, keys, values)


def _rows(r: _Reader, count: int) -> _Layer:
    type_id = r.unpack(_I32)
    row_bytes = r.unpack(_U64)
    data = np.frombuffer(r.take(count * row_bytes), dtype=np.uint8).reshape(count, row_bytes)
    return _Layer(type_id, row_bytes, data)


def _columns(r: _Reader, count: int) -> _Layer:
    type_id = r.unpack(_I32)
    element = r.unpack(_U32)
    n_embd = r.unpack(_U32)
    raw = r.take(n_embd * count * element)
    data = np.frombuffer(raw, dtype=np.uint8).reshape(n_embd, count, element)
    return _Layer(type_id, element, data)


def _write(state: _State) -> bytes:
    count = len(state.cells)
    out = [_U32.pack(MAGIC), _I32.pack(state.seq_id), _U32.pack(state.n_stream)]
    if count == 0:
        out.append(_U32.pack(0) * state.n_stream)
        return b"".join(out)
    # every stream but the first is empty; llama.cpp loads the cells into the stream of the
    # sequence it restores to, whichever stream they were written from
    out += [_U32.pack(count), state.cells.tobytes()]
    out += [_U32.pack(state.v_trans), _U32.pack(len(state.keys))]
    for layer in state.keys:
        out += [_I32.pack(layer.type_id), _U64.pack(layer.row_bytes), layer.data.tobytes()]
    for layer in state.values:
        if state.v_trans:
            n_embd = layer.data.shape[0]
            head = _I32.pack(layer.type_id) + _U32.pack(layer.row_bytes) + _U32.pack(n_embd)
        else:
            head = _I32.pack(layer.type_id) + _U64.pack(layer.row_bytes)
        out += [head, layer.data.tobytes()]
    out.append(_U32.pack(0) * (state.n_stream - 1))
    return b"".join(out)


def _pick(state: _State, indices: np.ndarray) -> _State:
    """A state of the cells at ``indices`` (in that order, repeats allowed)."""
    axis = 1 if state.v_trans else 0
    return _State(
        state.seq_id,
        state.n_stream,
        state.cells[indices],
        state.v_trans,
        [_Layer(k.type_id, k.row_bytes, k.data[indices]) for k in state.keys],
        [_Layer(v.type_id, v.row_bytes, np.take(v.data, indices, axis=axis)) for v in state.values],
    )


def split(blob: bytes, position: int) -> tuple[bytes, bytes]:
    """``(prefix, suffix)``: the cells at positions below ``position`` and those at or above it,
    each a state of its own. Raises ``UnsplittableState`` for a state this module cannot read."""
    state = _parse(blob)
    below = state.cells["pos"] < position
    return _write(_pick(state, np.flatnonzero(below))), _write(_pick(state, np.flatnonzero(~below)))


def join(prefix: bytes, suffix: bytes) -> bytes:
    """One state holding the cells of ``prefix`` then those of ``suffix`` (both from ``split``,
    of the same model and cache types). Raises ``UnsplittableState`` when they do not fit."""
    a, b = _parse(prefix), _parse(suffix)
    if not len(a.cells):
        return suffix
    if not len(b.cells):
        return prefix
    if (a.v_trans, len(a.keys)) != (b.v_trans, len(b.keys)):
        raise UnsplittableState("prefix and suffix come from differently shaped caches")
    axis = 1 if a.v_trans else 0
    joined = _State(
        b.seq_id,
        a.n_stream,
        np.concatenate([a.cells, b.cells]),
        a.v_trans,
        [_stack(x, y, 0) for x, y in zip(a.keys, b.keys, strict=True)],
        [_stack(x, y, axis) for x, y in zip(a.values, b.values, strict=True)],
    )
    return _write(joined)


def _stack(x: _Layer, y: _Layer, axis: int) -> _Layer:
    same_rows = np.delete(x.data.shape, axis).tolist() == np.delete(y.data.shape, axis).tolist()
    if (x.type_id, x.row_bytes) != (y.type_id, y.row_bytes) or not same_rows:
        raise UnsplittableState("prefix and suffix hold different K/V types")
    return _Layer(x.type_id, x.row_bytes, np.concatenate([x.data, y.data], axis=axis))


def tile(blob: bytes, length: int) -> bytes:
    """A state of ``length`` cells at positions 0..length-1 whose K/V rows repeat those of
    ``blob``'s cells in turn: a sequence filled to a given length without prefilling it (for
    timing decode steps, where the values do not matter but the cell count does)."""
    state = _parse(blob)
    if not len(state.cells) or length <= 0:
        raise UnsplittableState("nothing to tile")
    tiled = _pick(state, np.arange(length) % len(state.cells))
    tiled.cells["pos"] = np.arange(length)  # fancy indexing copied the cells: no one else sees
    return _write(tiled)


def with_stream_count(blob: bytes, n_stream: int) -> bytes:
    """``blob`` as a context with ``n_stream`` KV streams loads it (unchanged when it already
    says so). Raises ``UnsplittableState`` for a state this module cannot read."""
    if len(blob) >= 12 and _U32.unpack_from(blob, 8)[0] == n_stream:
        return blob
    state = _parse(blob)
    state.n_stream = n_stream
    return _write(state)
