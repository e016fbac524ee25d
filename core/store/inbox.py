"""The inbox: webhook deliveries written before the provider gets its 200, one per provider id."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg


@dataclass(frozen=True, slots=True)
class InboxRow:
    id: int
    agent_id: int
    channel: str
    provider_message_id: str
    conversation_key: str
    payload: Mapping[str, Any]
    status: str
    attempts: int
    received_at: datetime


_COLUMNS = ", ".join(InboxRow.__dataclass_fields__)


class Inbox:
    """Adds deliveries idempotently; the workers that claim and answer them live elsewhere."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def add(
        self,
        agent_id: int,
        channel: str,
        provider_message_id: str,
        conversation_key: str,
        payload: Mapping[str, Any],
    ) -> bool:
        """Store one delivery; False when this provider id was stored before (a re-delivery)."""
        added = await self._pool.fetchval(
            """INSERT INTO inbox (agent_id, channel, provider_message_id, conversation_key, payload)
               VALUES ($1, $2, $3, $4, $5)
               ON CONFLICT (agent_id, channel, provider_message_id) DO NOTHING
               RETURNING id""",
            agent_id,
            channel,
            provider_message_id,
            conversation_key,
            dict(payload),
        )
        return added is not None

    async def count(self, agent_id: int, channel: str) -> int:
        count = await self._pool.fetchval(
            "SELECT count(*) FROM inbox WHERE agent_id = $1 AND channel = $2", agent_id, channel
        )
        return int(count)

    async def rows(self, agent_id: int, channel: str) -> list[InboxRow]:
        """One channel's deliveries for an agent, oldest first."""
        rows = await self._pool.fetch(
            f"SELECT {_COLUMNS} FROM inbox WHERE agent_id = $1 AND channel = $2 ORDER BY id",
            agent_id,
            channel,
        )
        return [InboxRow(**dict(r)) for r in rows]
