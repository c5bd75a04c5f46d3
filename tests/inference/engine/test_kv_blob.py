"""Splitting a sequence's KV state at a position and joining the parts (shared prefixes in host RAM).

The synthetic states are written here from the format llama.cpp documents in
``src/llama-kv-cache.cpp`` (``state_write``), independently of ``kv_blob``'s writer; the real ones
come from the bundled model.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inference.engine import kv_blob
from inference.engine.kv_blob import UnsplittableState

LAYERS, K_ROW, V_EMBD, V_EL = 3, 8, 4, 2


def cell_bytes(pos: int, layer: int, kind: str) -> bytes:
    """A recognisable row for the cell at ``pos``."""
    return bytes((pos * 7 + layer * 3 + (kind == "v")) % 251 for _ in range(K_ROW))


def state(positions: list[int], *, v_trans: int = 0, n_stream: int = 1, stream: int = 0) -> bytes:
    """A one-sequence state holding ``positions`` (in that cell order) in stream ``stream``."""
    out = struct.pack("<IiI", 0xAF143CD8, 5, n_stream)
    for s in range(n_stream):
        if s != stream or not positions:
            out += struct.pack("<I", 0)
            continue
        out += struct.pack("<I", len(positions))
        for pos in positions:
            out += struct.pack("<iIi", pos, 1, 5)
        out += struct.pack("<II", v_trans, LAYERS)
        for layer in range(LAYERS):
            out += struct.pack("<iQ", 1, K_ROW)
            out += b"".join(cell_bytes(p, layer, "k") for p in positions)
        for layer in range(LAYERS):
            if not v_trans:
                out += struct.pack("<iQ", 1, K_ROW)
                out += b"".join(cell_bytes(p, layer, "v") for p in positions)
            else:
                out += struct.pack("<iII", 1, V_EL, V_EMBD)
                for j in range(V_EMBD):
                    out += b"".join(bytes([(p + j + layer) % 251]) * V_EL for p in positions)
    return out


@given(
    n=st.integers(min_value=0, max_value=40),
    cut=st.integers(min_value=-1, max_value=45),
    v_trans=st.sampled_from([0, 1]),
)
def test_split_then_join_gives_back_the_state(n: int, cut: int, v_trans: int) -> None:
    blob = state(list(range(n)), v_trans=v_trans, n_stream=4)
    prefix, suffix = kv_blob.split(blob, cut)
    assert prefix == state([p for p in range(n) if p < cut], v_trans=v_trans, n_stream=4)
    assert suffix == state([p for p in range(n) if p >= cut], v_trans=v_trans, n_stream=4)
    assert kv_blob.join(prefix, suffix) == blob


@pytest.mark.parametrize("v_trans", [0, 1])
def test_cells_are_cut_by_position_whatever_their_order_and_stream(v_trans: int) -> None:
    order = [4, 0, 5, 1, 2, 3]  # cells reused after a truncation sit anywhere in the stream
    prefix, suffix = kv_blob.split(state(order, v_trans=v_trans, n_stream=8, stream=3), 3)
    assert prefix == state([0, 1, 2], v_trans=v_trans, n_stream=8)
    assert suffix == state([4, 5, 3], v_trans=v_trans, n_stream=8)


def test_a_prefix_joins_another_session_s_suffix() -> None:
    prefix, _ = kv_blob.split(state(list(range(10))), 6)
    _, own = kv_blob.split(state(list(range(14)), stream=0), 6)
    assert kv_blob.join(prefix, own) == state(list(range(14)))


@pytest.mark.parametrize(
    ("blob", "reason"),
    [
        (state([0, 1]) + state([0, 1]), "after the state"),  # two caches (sliding window)
        (state([0, 1, 2])[:-3], "ends early"),
        (struct.pack("<IiII", 0xAF143CD8, 0, 1, 1) + struct.pack("<iIi", 0, 2, 0), "several seq"),
        (b"", "ends early"),
        (b"\0" * 64, "bad magic"),
    ],
)
def test_states_it_cannot_read_are_refused_by_name(blob: bytes, reason: str) -> None:
    with pytest.raises(UnsplittableState, match=reason):
        kv_blob.split(blob, 1)


def test_parts_of_different_caches_do_not_join() -> None:
    with pytest.raises(UnsplittableState, match="differently shaped"):
        kv_blob.join(state([0, 1]), state([2, 3], v_trans=1))


def restack(blob: bytes) -> bytes:
    """The same cells written as ``kv_blob`` writes them (in the first stream)."""
    return kv_blob.split(blob, 1 << 30)[0]


@pytest.mark.model
@pytest.mark.parametrize("flash_attn", ["on", "off"])  # off stores V transposed
def test_a_real_state_splits_where_a_truncated_sequence_ends(flash_attn: str) -> None:
    from inference.engine.llama import ContextShape, LlamaContext, LlamaModel
    from tests.support.processes import bundled_model_path

    model = LlamaModel(str(bundled_model_path()))
    ctx = LlamaContext(model, ContextShape(2, 256, flash_attn=flash_attn))
    try:
        for pos, token in enumerate(model.tokenize("The quick brown fox " * 12)[:48]):
            ctx.batch.add(token, pos, 1, want_logits=False)
        ctx.decode()
        ctx.batch.clear()
        whole = ctx.state_export(1)
        prefix, suffix = kv_blob.split(whole, 20)
        assert kv_blob.join(prefix, suffix) == kv_blob.join(*kv_blob.split(whole, 0))
        ctx.state_import(1, kv_blob.join(prefix, suffix))  # llama.cpp takes the joined state
        assert restack(ctx.state_export(1)) == kv_blob.join(prefix, suffix)
        ctx.seq_truncate(1, 20)
        assert restack(ctx.state_export(1)) == prefix
        assert len(prefix) + len(suffix) < len(whole) + 4096  # headers only (30 layers here)
    finally:
        ctx.close()
        model.close()


@pytest.mark.parametrize("v_trans", [0, 1])
def test_tiling_repeats_the_cells_at_consecutive_positions(v_trans: int) -> None:
    tiled = kv_blob.tile(state([0, 1, 2], v_trans=v_trans), 7)
    # rows of positions 0,1,2,0,1,2,0 written at positions 0..6: cut where each repeat starts
    first, rest = kv_blob.split(tiled, 3)
    assert first == state([0, 1, 2], v_trans=v_trans)
    assert len(kv_blob.split(rest, 6)[0]) == len(first)
    with pytest.raises(UnsplittableState):
        kv_blob.tile(state([]), 4)


def test_a_state_is_rewritten_for_a_context_of_the_other_layout() -> None:
    split_streams = state([0, 1, 2], n_stream=8, stream=5)
    assert kv_blob.with_stream_count(split_streams, 1) == state([0, 1, 2], n_stream=1)
    unified = state([0, 1, 2], n_stream=1)
    assert kv_blob.with_stream_count(unified, 1) is unified  # already right: no copy
    assert kv_blob.with_stream_count(unified, 8) == state([0, 1, 2], n_stream=8)


@pytest.mark.model
def test_a_session_moves_between_nodes_of_either_kv_layout() -> None:
    from inference.engine.llama import ContextShape, LlamaContext, LlamaModel
    from tests.support.processes import bundled_model_path

    model = LlamaModel(str(bundled_model_path()))
    unified = LlamaContext(model, ContextShape(4, 256, kv_unified=True))
    per_sequence = LlamaContext(model, ContextShape(4, 256, kv_unified=False))
    try:
        for pos, token in enumerate(model.tokenize("The quick brown fox " * 12)[:40]):
            unified.batch.add(token, pos, 2, want_logits=False)
        unified.decode()
        unified.batch.clear()
        per_sequence.state_import(1, unified.state_export(2))  # llama.cpp alone refuses this
        unified.state_import(3, per_sequence.state_export(1))
        moved = unified.state_export(3)
        unified.state_import(3, unified.state_export(2))
        assert moved == unified.state_export(3)  # the same cells as a copy that never left
    finally:
        unified.close()
        per_sequence.close()
        model.close()
