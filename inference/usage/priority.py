"""Who waits when the control plane is full: a priority queue in front of the proxy.

A control-plane process keeps at most the routing policy's ``max_inflight`` turns open. Past
it, a turn waits up to the policy's ``queue_wait_s`` for one to end; the waiting turns are let
in highest ``priority`` first (the caller's quota, 0-9), in arrival order within a priority.
The queue holds at most ``max_inflight`` turns: when it is full, a newcomer of higher
priority takes the place of the lowest-priority, latest waiter, which is refused; otherwise
the newcomer is. Refused turns get ``ArrayFull`` (429 with Retry-After). With
``queue_wait_s`` 0 nobody waits: past ``max_inflight`` every turn is refused at once.

One gate per process, on its event loop (no locking). Several control-plane replicas each
keep their own ``max_inflight``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from dataclasses import dataclass, field

from inference.errors import ArrayFull


@dataclass(order=True)
class _Waiter:
    rank: int  # -priority: the heap's smallest is the highest priority
    order: int
    future: asyncio.Future[None] = field(compare=False)


class PriorityGate:
    """The process's turns in flight (``holding``) and the queue waiting for a slot."""

    def __init__(self) -> None:
        self.holding = 0
        self.capacity = 0
        self._queue: list[_Waiter] = []
        self._order = itertools.count()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    async def enter(self, *, priority: int, capacity: int, wait_s: float) -> bool:
        """Take a slot, waiting up to ``wait_s`` s; True when one is held (``leave`` it when
        the turn ends), False when there is no gate (``capacity`` 0). Raises ``ArrayFull``
        (429) when refused (module doc)."""
        self.capacity = capacity
        if not capacity:
            return False
        if self.holding < capacity and not self._queue:
            self.holding += 1
            return True
        if wait_s <= 0:
            raise self._full("retry shortly")
        self._make_room(priority, capacity)
        waiter = _Waiter(-priority, next(self._order), asyncio.get_running_loop().create_future())
        heapq.heappush(self._queue, waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), wait_s)
        except TimeoutError:
            self._give_up(waiter)
            raise self._full(f"it waited {wait_s:g} s for a slot") from None
        except BaseException:
            self._give_up(waiter)
            raise
        return True

    def _make_room(self, priority: int, capacity: int) -> None:
        if len(self._queue) < capacity:
            return
        lowest = max(self._queue)
        if -lowest.rank >= priority:
            raise self._full("the queue is full of turns of the same or higher priority")
        self._queue.remove(lowest)
        heapq.heapify(self._queue)
        lowest.future.set_exception(self._full("a turn of higher priority took its place"))

    def _give_up(self, waiter: _Waiter) -> None:
        """A waiter that timed out, was refused or cancelled: out of the queue; a slot it was
        given meanwhile goes to the next."""
        if waiter in self._queue:
            self._queue.remove(waiter)
            heapq.heapify(self._queue)
        future = waiter.future
        if not future.done():
            future.cancel()
        elif not future.cancelled() and future.exception() is None:
            self.leave()  # a slot came just as it gave up

    def leave(self) -> None:
        """A turn ended: its slot goes to the highest-priority waiter."""
        self.holding = max(0, self.holding - 1)
        while self._queue and self.holding < max(self.capacity, 1):
            waiter = heapq.heappop(self._queue)
            if waiter.future.done():
                continue
            self.holding += 1
            waiter.future.set_result(None)

    def _full(self, why: str) -> ArrayFull:
        return ArrayFull(
            f"The control plane has {self.holding} turns open (max_inflight {self.capacity}) "
            f"and {len(self._queue)} waiting; {why}.",
            retry_after=1,
        )


gate = PriorityGate()
