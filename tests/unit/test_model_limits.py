"""Per-agent model limits: concurrency and requests per minute, read from the agent's settings."""

from __future__ import annotations

import asyncio

import pytest

from core.errors import InvalidInput
from core.llm.limits import DEFAULT_LLM_CONCURRENCY, AgentLimits, ModelLimits, validate_llm_limits


async def test_calls_over_the_concurrency_wait_in_order() -> None:
    limits = ModelLimits()
    settings = {"llm_concurrency": 2}
    release = asyncio.Event()
    order: list[int] = []

    async def call(number: int) -> None:
        async with limits.call(7, settings):
            order.append(number)
            await release.wait()

    tasks = [asyncio.create_task(call(n)) for n in range(5)]
    await asyncio.sleep(0.01)
    assert (limits.writing(7), limits.waiting(7)) == (2, 3)
    assert limits.waiting(8) == 0  # other agents are counted apart
    release.set()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]
    assert (limits.writing(7), limits.waiting(7)) == (0, 0)


async def test_requests_per_minute_hold_back_the_rest_of_the_minute() -> None:
    limits = ModelLimits(period=60.0)
    settings = {"llm_requests_per_minute": 3}
    started: list[int] = []

    async def call(number: int) -> None:
        async with limits.call(7, settings):
            started.append(number)

    tasks = [asyncio.create_task(call(n)) for n in range(4)]
    await asyncio.sleep(0.01)
    assert started == [0, 1, 2]
    assert limits.waiting(7) == 1
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert limits.waiting(7) == 0


async def test_a_changed_setting_applies_to_the_next_calls() -> None:
    limits = ModelLimits()
    async with limits.call(7, {"llm_concurrency": 1}), limits.call(7, {"llm_concurrency": 2}):
        assert limits.writing(7) == 1  # counted on the new gate


def test_the_settings_are_read_and_checked() -> None:
    assert AgentLimits.of({}) == AgentLimits(DEFAULT_LLM_CONCURRENCY, None)
    assert AgentLimits.of({"llm_concurrency": 4, "llm_requests_per_minute": 500}) == AgentLimits(
        4, 500.0
    )
    for bad in (
        {"llm_concurrency": 0},
        {"llm_concurrency": 2.5},
        {"llm_concurrency": True},
        {"llm_requests_per_minute": 0.5},
        {"llm_requests_per_minute": "fast"},
    ):
        with pytest.raises(InvalidInput):
            validate_llm_limits(bad)


async def test_a_malformed_setting_stored_anyway_falls_back_to_the_defaults() -> None:
    limits = ModelLimits()
    async with limits.call(7, {"llm_concurrency": "many"}):
        assert limits.writing(7) == 1
