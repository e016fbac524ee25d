"""Per-agent limits on answers written by the language model, kept by each process.

A worker process may have dozens of turns waiting on the model at once; an agent's settings
cap how many of its answers are written at once (``llm_concurrency``, default
`DEFAULT_LLM_CONCURRENCY`) and how many are started per minute (``llm_requests_per_minute``,
default none: a leaky bucket from `aiolimiter` when set), so a burst respects the model
provider's limits. An answer over a limit waits for its turn, in order. Each process keeps
its own count: with N processes the provider sees up to N times the limits.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiolimiter import AsyncLimiter

from core.errors import InvalidInput

log = logging.getLogger(__name__)

# Answers of one agent that one process has the model write at once, unless the agent says.
DEFAULT_LLM_CONCURRENCY = 128
CONCURRENCY_SETTING = "llm_concurrency"
RATE_SETTING = "llm_requests_per_minute"


@dataclass(frozen=True, slots=True)
class AgentLimits:
    concurrency: int = DEFAULT_LLM_CONCURRENCY
    requests_per_minute: float | None = None

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> AgentLimits:
        """The limits in an agent's settings; `InvalidInput` names a malformed one."""
        concurrency = settings.get(CONCURRENCY_SETTING)
        rate = settings.get(RATE_SETTING)
        if concurrency is not None and (
            isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
        ):
            raise InvalidInput(f"{CONCURRENCY_SETTING} must be a whole number of at least 1")
        if rate is not None and (
            isinstance(rate, bool)
            or not isinstance(rate, int | float)
            or not math.isfinite(rate)
            or rate < 1
        ):
            raise InvalidInput(f"{RATE_SETTING} must be a number of at least 1")
        return cls(
            concurrency=concurrency if concurrency is not None else DEFAULT_LLM_CONCURRENCY,
            requests_per_minute=float(rate) if rate is not None else None,
        )


def validate_llm_limits(settings: Mapping[str, Any]) -> None:
    """Raise `InvalidInput` when an agent's settings hold a malformed model limit."""
    AgentLimits.of(settings)


class _Gate:
    """One agent's limits and the calls waiting for them."""

    def __init__(self, limits: AgentLimits, period: float) -> None:
        self.limits = limits
        self.semaphore = asyncio.Semaphore(limits.concurrency)
        # aiolimiter lets a full minute's worth through at once, as the providers' own
        # buckets do, then one at a time as the bucket drains.
        rate = limits.requests_per_minute
        self.rate = AsyncLimiter(rate, period) if rate is not None else None
        self.waiting = 0
        self.writing = 0


class ModelLimits:
    """The per-agent gates of one process. ``period`` is how many seconds the rate's minute
    lasts (tests shorten it)."""

    def __init__(self, *, period: float = 60.0) -> None:
        self._period = period
        self._gates: dict[int, _Gate] = {}

    def _gate(self, agent_id: int, settings: Mapping[str, Any]) -> _Gate:
        try:
            limits = AgentLimits.of(settings)
        except InvalidInput as exc:
            # Written past the checks (by hand, in SQL): answers go on under the defaults.
            log.warning("llm.limits.invalid agent_id=%d error=%s", agent_id, exc.message)
            limits = AgentLimits()
        gate = self._gates.get(agent_id)
        if gate is None or gate.limits != limits:
            # Changed settings apply to the calls that start from now on; calls holding the
            # old gate finish under it.
            gate = self._gates[agent_id] = _Gate(limits, self._period)
        return gate

    @asynccontextmanager
    async def call(self, agent_id: int, settings: Mapping[str, Any]) -> AsyncIterator[None]:
        """Hold one of the agent's model calls for the block, after waiting for its limits."""
        gate = self._gate(agent_id, settings)
        gate.waiting += 1
        try:
            await gate.semaphore.acquire()
            try:
                if gate.rate is not None:
                    await gate.rate.acquire()
            except BaseException:
                gate.semaphore.release()
                raise
        finally:
            gate.waiting -= 1
        gate.writing += 1
        try:
            yield
        finally:
            gate.writing -= 1
            gate.semaphore.release()

    def waiting(self, agent_id: int) -> int:
        """The agent's calls waiting for its limits in this process now."""
        gate = self._gates.get(agent_id)
        return gate.waiting if gate is not None else 0

    def writing(self, agent_id: int) -> int:
        """The agent's calls under way in this process now."""
        gate = self._gates.get(agent_id)
        return gate.writing if gate is not None else 0
