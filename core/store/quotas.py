"""Counting what quotas limit: an agent's answered turns since a moment, from the turns table."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import asyncpg


async def answered_since(
    pool: asyncpg.Pool,
    agent_id: int,
    since: datetime,
    *,
    free_modes: Sequence[str],
    free_channels: Sequence[str],
) -> int:
    """The agent's turns since ``since``, but those of ``free_modes`` (small talk, held for
    staff...) and of ``free_channels`` (the playground, answer checks)."""
    found: int = await pool.fetchval(
        """SELECT count(*) FROM turns
            WHERE agent_id = $1 AND created_at >= $2
              AND NOT (mode = ANY($3::text[])) AND NOT (channel = ANY($4::text[]))""",
        agent_id,
        since,
        list(free_modes),
        list(free_channels),
    )
    return found
