"""Timing the node's llama.cpp settings again once its traffic is known.

At load the candidates (KV layout, flash attention: ``tuning``) are timed at the decode fill
this node's traffic had when it last ran (``tuning.fill_for``), or at half a sequence on a
first start, a guess: which setting wins flips between about 256 and 1,024 cells per sequence
on these CPUs (docs/engine.md). When this run's traffic decodes at another fill (its mean,
weighed as ``tuning.remember_traffic`` weighs it, rounds to another power of two:
``tuning.fill_bucket``), the engine times the candidates again at that fill the next time it is
idle (nothing running or waiting), at most once per fill a run, and moves onto the winner when
it decodes at least ``RETIME_MIN_GAIN`` times faster than the setting in use. Moving creates a
context with the new setting (the old one serves until it exists), carries the sessions held
in sequences over through host RAM when flash attention is unchanged (llama.cpp refuses a state
written under the other flash-attention setting, so otherwise they and the host-RAM store are
forgotten and their next turns prefilled), and loads the shared prefixes saved for the new
setting. The timing takes 2-4 s here (four candidates); a request that arrives meanwhile
waits for it. A ``--repeatable`` node keeps the settings it loaded with: a seeded text must not
change because a setting did mid-run.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import psutil

from inference.engine import tuning, warm
from inference.engine.config import EngineConfig
from inference.engine.llama import ContextShape, LlamaContext, LlamaModel
from inference.engine.sequences import SequenceTable
from inference.engine.stats import EngineStats

log = logging.getLogger(__name__)

# The winner at the traffic's fill must decode this many times faster than the setting in use:
# moving costs the cells of the shared prefixes (and the sessions' KV when flash attention
# changes), and a timing on a busy machine moves by 10 % or more between runs.
RETIME_MIN_GAIN = 1.1


class Retiming:
    """Mixin of ``Engine`` (``scheduler.py``), run on its thread; the attributes below are
    ``Engine``'s (set at load), as are ``_warm_up``, ``_prefix_keeper`` and
    ``_prefixes_loaded``."""

    config: EngineConfig
    model: LlamaModel | None
    ctx: LlamaContext | None
    table: SequenceTable | None
    stats: EngineStats
    prefixes: warm.PrefixKeeper | None
    tuning: tuning.Tuning | None
    warm: dict
    _base_shape: ContextShape | None  # the shape before the timed settings were put in
    _candidates: list[tuning.Setting]
    _timed_fills: set[int]  # the fills this run's settings were timed at
    _traffic_before: tuple[int, int]
    _stopping: bool
    kv_bytes_per_token: int

    def _retime_for_traffic(self) -> None:
        """Time the candidates at this run's traffic fill when it is one not timed yet this run,
        and move onto the winner when it pays (``RETIME_MIN_GAIN``). ``self.tuning`` then says
        the fill and the step times; its setting is the one in use. Nothing here raises out of
        the engine thread: a failure is logged and the context in use kept."""
        fill = self._traffic_fill()
        if fill is None or fill in self._timed_fills or self._stopping:
            return
        self._timed_fills.add(fill)
        room = self._memory_refusal()
        if room:
            log.warning("settings not timed again at %d cells: %s", fill, room)
            return
        try:
            self._retime_at(fill)
        except Exception:  # noqa: BLE001 - the node goes on with the settings it has
            log.exception("settings not timed again at %d cells", fill)

    def _retime_at(self, fill: int) -> None:
        found = tuning.choose(self.model, self._base_shape, self._candidates, fill)
        current = tuning.Setting(self.tuning.unified, self.tuning.flash_attn)
        best = tuning.Setting(found.unified, found.flash_attn)
        gain = found.step_ms[current.name] / max(found.step_ms[best.name], 1e-9)
        if self._stopping:
            return
        if best != current and gain >= RETIME_MIN_GAIN and self._move_to(best):
            log.info("traffic at %d cells: %s -> %s (%.2fx)", fill, current.name, best.name, gain)
            self.tuning = found
        else:
            self.tuning = replace(found, unified=current.unified, flash_attn=current.flash_attn)

    def _memory_refusal(self) -> str:
        """Why a second context cannot be afforded now ('' when it can): timing a candidate and
        moving each create a context beside the one serving, so twice its KV cache
        (``sequences * ctx_per_seq`` cells) must be free in host memory."""
        kv_bytes = self.config.sequences * self.config.ctx_per_seq * self.kv_bytes_per_token
        available = psutil.virtual_memory().available
        if available < 2 * kv_bytes:
            return f"{available >> 20} MiB free, {2 * kv_bytes >> 20} MiB needed"
        return ""

    def _traffic_fill(self) -> int | None:
        """``tuning.fill_bucket`` of the mean cells a decoded token's sequence held (what was
        remembered at load at half weight plus this run), or None when the settings were not
        timed (set by hand), the node is repeatable (its texts must not move with a setting
        changed mid-run) or this run decoded fewer than ``TRAFFIC_MIN_TOKENS`` tokens."""
        tokens = self.stats.decode_fill_tokens_total
        if self.tuning is None or self.config.repeatable or tokens < tuning.TRAFFIC_MIN_TOKENS:
            return None
        cells, tokens = tuning.merged_traffic(
            self._traffic_before, self.stats.decode_fill_cells_total, tokens
        )
        return tuning.fill_bucket(cells / tokens, self.config.ctx_per_seq)

    def _move_to(self, setting: tuning.Setting) -> bool:
        """Serve from a new context with ``setting`` (every sequence idle); False, the old
        context kept as it was, when llama.cpp cannot create it or warm it up or a session
        cannot be copied out of the old one (logged)."""
        shape = replace(self._base_shape, kv_unified=setting.unified, flash_attn=setting.flash_attn)
        ctx = None
        try:
            ctx = LlamaContext(self.model, shape)
            self._warm_up(ctx)
            self.table.rebind(ctx, keep_sessions=setting.flash_attn == self.tuning.flash_attn)
        except Exception as exc:  # noqa: BLE001 - the old context serves on
            if ctx is not None:
                ctx.close()
            log.warning("settings not changed to %s: %s", setting.name, exc)
            return False
        old, keeper = self.ctx, self.prefixes
        keeper.close()  # prefix files being written are finished
        self.ctx = ctx
        old.close()
        self.prefixes = self._prefix_keeper(ctx)
        self.prefixes.saved = keeper.saved
        self.table.on_shared = self.prefixes.shared
        self.warm["prefixes_loaded"] = self._prefixes_loaded()
        for tokens in keeper.held:  # registered openings: held again (prefilled if not loaded)
            self.prefixes.hold(self.table, tokens, self.config.n_batch)
        return True
