"""The priority gate in front of the proxy (``inference.usage.priority``): who waits, who is
let in first, who is refused when the control plane is full."""

from __future__ import annotations

import asyncio

import pytest

from inference.errors import ArrayFull
from inference.usage.priority import PriorityGate


async def test_it_lets_turns_in_up_to_the_capacity_then_refuses_at_once_without_a_wait():
    gate = PriorityGate()
    assert await gate.enter(priority=5, capacity=2, wait_s=0)
    assert await gate.enter(priority=5, capacity=2, wait_s=0)
    with pytest.raises(ArrayFull) as refused:
        await gate.enter(priority=9, capacity=2, wait_s=0)
    assert refused.value.status == 429 and refused.value.retry_after == 1
    assert "max_inflight 2" in refused.value.message


async def test_no_capacity_means_no_gate():
    gate = PriorityGate()
    assert not await gate.enter(priority=5, capacity=0, wait_s=5)
    assert gate.holding == 0


async def test_a_freed_slot_goes_to_the_highest_priority_then_the_earliest():
    gate = PriorityGate()
    for _ in range(3):
        await gate.enter(priority=5, capacity=3, wait_s=5)
    order: list[str] = []

    async def wait(name: str, priority: int) -> None:
        await gate.enter(priority=priority, capacity=3, wait_s=5)
        order.append(name)

    tasks = [
        asyncio.create_task(wait("low", 1)),
        asyncio.create_task(wait("high-first", 8)),
        asyncio.create_task(wait("high-second", 8)),
    ]
    await asyncio.sleep(0.01)
    assert gate.waiting == 3 and order == []
    for _ in range(3):
        gate.leave()
        await asyncio.sleep(0.01)
    await asyncio.gather(*tasks)
    assert order == ["high-first", "high-second", "low"]


async def test_when_the_queue_is_full_the_lowest_priority_is_refused_first():
    gate = PriorityGate()
    await gate.enter(priority=5, capacity=1, wait_s=5)
    low = asyncio.create_task(gate.enter(priority=2, capacity=1, wait_s=5))
    await asyncio.sleep(0.01)
    high = asyncio.create_task(gate.enter(priority=7, capacity=1, wait_s=5))
    await asyncio.sleep(0.01)
    with pytest.raises(ArrayFull, match="higher priority took its place"):
        await low  # the queue holds one: the low one made way
    with pytest.raises(ArrayFull, match="same or higher priority"):
        await gate.enter(priority=7, capacity=1, wait_s=5)  # not above the one waiting
    gate.leave()
    assert await high
    assert gate.holding == 1 and gate.waiting == 0


async def test_a_turn_that_waits_too_long_is_refused_and_leaves_the_queue():
    gate = PriorityGate()
    await gate.enter(priority=5, capacity=1, wait_s=5)
    with pytest.raises(ArrayFull, match="waited 0.05 s"):
        await gate.enter(priority=9, capacity=1, wait_s=0.05)
    assert gate.waiting == 0
    gate.leave()
    assert gate.holding == 0  # nobody took the slot of the one that gave up


async def test_a_cancelled_waiter_gives_its_slot_on():
    gate = PriorityGate()
    for _ in range(2):
        await gate.enter(priority=5, capacity=2, wait_s=5)
    gone = asyncio.create_task(gate.enter(priority=9, capacity=2, wait_s=5))
    stays = asyncio.create_task(gate.enter(priority=1, capacity=2, wait_s=5))
    await asyncio.sleep(0.01)
    gone.cancel()
    await asyncio.sleep(0.01)
    gate.leave()
    assert await stays
    assert gate.holding == 2 and gate.waiting == 0
