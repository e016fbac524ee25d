"""Quotas: how many answers a visitor gets per day, and an agent per month.

A visitor is one conversation of one channel (for WhatsApp and Telegram its key is the
customer's own number or chat id); days and months run in the agent's time zone. On the
widget, where a visitor can start a new session at will, the day is also counted per network
address (an IPv6 /64 as one): one address gets ``address_share`` visitors' days (an office, a
household or a carrier's NAT is many visitors), and a visitor whose address has used them
gets the visitor's quota message like one whose own day is used up.

- The agent's month is counted from the turns stored in PostgreSQL, so it survives restarts
  and outages: it is what a bill would be based on.
- The visitor's day is a counter in the cache. While Redis is down the counter reads as zero
  (and what is counted then is kept in the process only), so an outage can only give a
  visitor more answers, never fewer.

Small talk, turns held for staff, requests for a person and the quota message itself do not
count, nor do the playground and answer checks. Two turns at the very same moment may both
pass the last free place: a quota is a limit on cost and abuse, not an exact count.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime, time
from typing import Any
from zoneinfo import ZoneInfo

import asyncpg

from core.answer.phrases import phrase
from core.clients import parse_address, subscriber
from core.ports import Cache
from core.store.agents import Agent
from core.store.quotas import answered_since
from core.turns import TurnRequest

# Turns that cost nothing and answer no question; with the rehearsal channels, never counted.
FREE_MODES = ("smalltalk", "quota", "staff", "handoff")
FREE_CHANNELS = ("playground", "test")
# The visitor's counter outlives its day by a day: in any time zone it is gone by then.
_DAY_TTL = 2 * 24 * 60 * 60
# Visitors' days one network address gets, by default.
ADDRESS_SHARE = 5


def _limit(value: object) -> int | None:
    """A configured limit: a positive whole number, else (0, None, nonsense) unlimited."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return int(value)


def agent_limit(settings: Mapping[str, Any], key: str, default: int | None) -> int | None:
    """An agent's own limit (``quota_visitor_day``, ``quota_agent_month``) when it has one
    (0: unlimited), else the server's ``default``."""
    own = settings.get(key)
    return _limit(own) if own is not None else _limit(default)


@dataclass(frozen=True, slots=True)
class QuotaState:
    """Where a visitor and the agent stand before this turn."""

    visitor_day: int | None  # the limits; None: unlimited
    agent_month: int | None
    visitor_used: int = 0  # answers counted before this turn
    agent_used: int = 0
    counter: str | None = None  # the cache key of the visitor's day; None: not counted
    # The visitor's network address's day, where the channel knows it (the widget).
    address_day: int | None = None
    address_used: int = 0
    address_counter: str | None = None

    @property
    def exhausted(self) -> str | None:
        """Which quota has run out ("agent_month" first), or None; the address's day used
        up is the visitor's day used up."""
        if self.agent_month is not None and self.agent_used >= self.agent_month:
            return "agent_month"
        if self.visitor_day is not None and self.visitor_used >= self.visitor_day:
            return "visitor_day"
        if self.address_day is not None and self.address_used >= self.address_day:
            return "visitor_day"
        return None

    def remaining(self) -> dict[str, int | None]:
        """What is left once this turn is answered (or, run out, nothing); None: unlimited.
        The visitor's day is the less of their own and their address's."""
        spent = 0 if self.exhausted else 1
        own = _left(self.visitor_day, self.visitor_used + spent)
        shared = _left(self.address_day, self.address_used + spent)
        return {
            "visitor_day": shared if own is None else own if shared is None else min(own, shared),
            "agent_month": _left(self.agent_month, self.agent_used + spent),
        }

    def message(self, language: str, contact_route: str) -> str:
        """The friendly message for a quota that has run out, in ``language``."""
        text = phrase(f"quota_{self.exhausted or 'visitor_day'}", language)
        route = contact_route.strip().rstrip(".")
        return f"{text} {phrase('contact', language, route=route)}" if route else text


def _left(limit: int | None, used: int) -> int | None:
    return None if limit is None else max(0, limit - used)


class Quotas:
    """Reads the quotas before a turn and counts the turn after it is saved."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        cache: Cache,
        *,
        visitor_day: int | None = None,
        agent_month: int | None = None,
        address_share: int = ADDRESS_SHARE,
    ) -> None:
        self._pool = pool
        self._cache = cache
        self._visitor_day = visitor_day
        self._agent_month = agent_month
        self._address_share = address_share  # 0: addresses are not counted

    async def check(self, request: TurnRequest, agent: Agent, now: datetime) -> QuotaState:
        if request.channel in FREE_CHANNELS:
            return QuotaState(None, None)
        settings = agent.settings
        per_visitor = agent_limit(settings, "quota_visitor_day", self._visitor_day)
        per_month = agent_limit(settings, "quota_agent_month", self._agent_month)
        local = now.astimezone(ZoneInfo(agent.timezone))
        counter = address_counter = None
        visitor_used = agent_used = address_used = 0
        per_address = None
        if per_visitor is not None:
            counter = _counter(agent.id, request, local.date())
            visitor_used = int(await self._cache.get(counter) or 0)
            address_counter = self._address_counter(agent.id, request, local.date())
        if address_counter is not None and per_visitor is not None:
            per_address = per_visitor * self._address_share
            address_used = int(await self._cache.get(address_counter) or 0)
        if per_month is not None:
            month_start = datetime.combine(local.date().replace(day=1), time(), local.tzinfo)
            agent_used = await answered_since(
                self._pool,
                agent.id,
                month_start,
                free_modes=FREE_MODES,
                free_channels=FREE_CHANNELS,
            )
        return QuotaState(
            per_visitor, per_month, visitor_used, agent_used, counter,
            per_address, address_used, address_counter if per_address is not None else None,
        )  # fmt: skip

    async def spend(self, state: QuotaState, mode: str) -> None:
        """Count a saved turn of ``mode`` against the visitor's day and their address's (the
        month counts itself: it is the stored turns)."""
        if mode in FREE_MODES:
            return
        for counter in (state.counter, state.address_counter):
            if counter is not None:
                await self._cache.incr(counter, 1, ttl=_DAY_TTL)

    def _address_counter(self, agent_id: int, request: TurnRequest, day: date) -> str | None:
        if not self._address_share or request.client_address is None:
            return None
        if parse_address(request.client_address) is None:
            return None  # no address known ("unknown"): nothing to tell visitors apart by
        return _key("address", agent_id, subscriber(request.client_address), day)


def _counter(agent_id: int, request: TurnRequest, day: date) -> str:
    return _key("visitor", agent_id, f"{request.channel}\x00{request.conversation_key}", day)


def _key(kind: str, agent_id: int, who: str, day: date) -> str:
    # The conversation key may be a phone number, the address is personal data too: the
    # cache keeps only a digest.
    digest = hashlib.sha256(who.encode()).hexdigest()
    return f"quota:{kind}:{agent_id}:{digest[:32]}:{day.isoformat()}"
