"""When each session is expected back: the forecast the host-RAM store evicts by."""

from __future__ import annotations

import math
import statistics
from collections import OrderedDict

ABANDONED_AFTER_GAPS = 4  # a session not back within 4 of its usual gaps is presumed gone
FORECAST_SESSIONS = 4096  # sessions whose turn gaps are remembered (oldest forgotten first)


class ReuseForecast:
    """When each session is expected back, from the gaps between its own turns.

    Time is counted in turns of the whole node (``note_turn`` per request), so a forecast means
    "about N other turns from now". An agent session comes back after a gap of roughly the
    number of sessions interleaved with it (its reuse distance), and keeps that rhythm; a
    session not back within ``ABANDONED_AFTER_GAPS`` of its gaps is presumed gone. Evicting the
    entry due back last is Belady's rule (L. A. Belady, "A study of replacement algorithms for a
    virtual-storage computer", IBM Systems Journal 5(2), 1966) on this forecast: with sessions
    taking turns round-robin it keeps a fixed set warm instead of dropping each entry just
    before it is needed, which is what least-recently-used does.
    """

    def __init__(self) -> None:
        self.tick = 0
        self._last: OrderedDict[str, int] = OrderedDict()
        self._gap: dict[str, float] = {}

    def note_turn(self, session_id: str) -> None:
        """A request of ``session_id`` starts now."""
        self.tick += 1
        last = self._last.pop(session_id, None)
        if last is not None:
            gap = float(self.tick - last)
            before = self._gap.get(session_id)
            self._gap[session_id] = gap if before is None else (before + gap) / 2
        self._last[session_id] = self.tick
        while len(self._last) > FORECAST_SESSIONS:
            gone, _ = self._last.popitem(last=False)
            self._gap.pop(gone, None)

    def expect(self, session_id: str) -> None:
        """``session_id`` is due now, with a typical gap: a session moved here from another
        node (its state imported) whose next turn is about to come."""
        gap = self.typical_gap()
        self._last.pop(session_id, None)
        self._last[session_id] = self.tick - int(gap)
        self._gap[session_id] = gap

    def due_in(self, session_id: str, typical: float | None = None) -> float:
        """Turns until ``session_id`` is expected back (``inf`` when unknown or presumed gone).

        A session seen once is given the median gap of the others (or the number of sessions
        known, when no gap is); ``typical`` is that figure when the caller already has it."""
        last = self._last.get(session_id)
        if last is None:
            return math.inf
        gap = self._gap.get(session_id) or typical or self.typical_gap()
        since = self.tick - last
        if since > ABANDONED_AFTER_GAPS * gap:
            return math.inf
        return max(gap - since, 0.0)

    def typical_gap(self) -> float:
        """The median gap between turns of the sessions known (their count when none has one)."""
        if self._gap:
            return statistics.median(self._gap.values())
        return float(max(1, len(self._last)))
