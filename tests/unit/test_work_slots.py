"""Work slots: a turn waiting on the network gives its slot back; turns already begun go first."""

from __future__ import annotations

import asyncio

import pytest

from core.slots import WorkSlots, network_wait, working_in


async def test_a_turn_waiting_on_the_network_lets_another_work() -> None:
    slots = WorkSlots(1)
    first = slots.try_take()
    assert first is not None
    assert slots.try_take() is None
    model_answered = asyncio.Event()
    in_the_wait = asyncio.Event()

    async def turn() -> None:
        with working_in(first):
            async with network_wait():
                in_the_wait.set()
                await model_answered.wait()
            assert first.held  # back in a slot for the rest of its work

    task = asyncio.create_task(turn())
    await in_the_wait.wait()
    second = slots.try_take()
    assert second is not None  # the waiting turn's slot
    model_answered.set()
    await asyncio.sleep(0)
    assert not task.done()  # the first turn waits for a slot to finish its work
    assert slots.try_take() is None
    second.give_back()
    await task
    assert slots.in_use == 0


async def test_a_turn_coming_back_goes_before_a_new_one() -> None:
    slots = WorkSlots(1)
    first = slots.try_take()
    assert first is not None
    first.give_back()  # waiting on the model
    other = slots.try_take()
    assert other is not None
    coming_back = asyncio.create_task(first.take_back())
    await asyncio.sleep(0)
    other.give_back()
    assert slots.try_take() is None  # the slot went to the turn coming back
    await coming_back
    assert first.held


async def test_only_the_turns_own_task_gives_its_slot_back() -> None:
    slots = WorkSlots(1)
    slot = slots.try_take()
    assert slot is not None

    async def started_by_the_turn() -> None:
        async with network_wait():
            assert slot.held

    with working_in(slot):
        await asyncio.create_task(started_by_the_turn())
        assert slot.held
    assert not slot.held
    assert slots.in_use == 0


async def test_a_turn_cancelled_while_waiting_does_not_take_a_slot_again() -> None:
    freed: list[int] = []
    slots = WorkSlots(1, on_free=lambda: freed.append(1))
    slot = slots.try_take()
    assert slot is not None
    waiting = asyncio.Event()

    async def turn() -> None:
        with working_in(slot):
            async with network_wait():
                waiting.set()
                await asyncio.Event().wait()

    task = asyncio.create_task(turn())
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert slots.in_use == 0
    assert freed == [1]  # given back once, for the wait


async def test_a_waiter_cancelled_after_being_handed_a_slot_passes_it_on() -> None:
    slots = WorkSlots(1)
    held = slots.try_take()
    assert held is not None
    first = asyncio.create_task(slots.take())
    second = asyncio.create_task(slots.take())
    await asyncio.sleep(0)
    held.give_back()  # handed to the first waiter...
    first.cancel()  # ...which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await first
    slot = await asyncio.wait_for(second, 1)
    assert slot.held
    assert slots.in_use == 1


async def test_no_new_turn_starts_while_more_urgent_work_waits() -> None:
    urgent = [False]
    slots = WorkSlots(2, defer=lambda: urgent[0])
    begun = slots.try_take()
    assert begun is not None
    urgent[0] = True  # say, webhooks of this process waiting to be acknowledged
    assert slots.try_take() is None
    # A turn already begun carries on: it gets its slot back after waiting on the model.
    begun.give_back()
    await asyncio.wait_for(begun.take_back(), 1)
    assert begun.held
    urgent[0] = False
    assert slots.try_take() is not None
