"""Staff notifications in Postgres: who waits for a person, and the webhook deliveries.

A `handoff.requested` row is written by a trigger (migration 0016) in the transaction that
sets a conversation to ``waiting_for_staff``; `conversation.waiting` rows are written by
`record_waiting` when a wait has lasted too long. Each row is also one webhook delivery.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import asyncpg

from core.store.handoff import UNREACHABLE

NotificationType = Literal["handoff.requested", "conversation.waiting"]

# A conversation counts as waiting when staff were asked for (status waiting_for_staff), or
# a visitor message is answered by neither the bot nor staff. Unreachable channels (the API,
# the playground) are left out: nobody could answer there later. Only conversations active in
# the last two days are read for unanswered messages, which keeps the scan short.
_WAITING = """
SELECT c.id,
       CASE WHEN c.status = 'waiting_for_staff'
            THEN coalesce(c.status_changed_at, c.last_message_at)
            ELSE u.first_unanswered END AS since,
       c.status = 'waiting_for_staff' AS asked
  FROM conversations c
  LEFT JOIN LATERAL (
       SELECT min(m.created_at) AS first_unanswered
         FROM messages m
        WHERE m.conversation_id = c.id AND m.role = 'visitor' AND m.generation = c.generation
          AND m.id > coalesce((SELECT max(r.id) FROM messages r
                                WHERE r.conversation_id = c.id
                                  AND r.role IN ('assistant', 'staff')), 0)
  ) u ON c.status <> 'waiting_for_staff'
 WHERE c.channel <> ALL($1::text[])
   AND (c.status = 'waiting_for_staff' OR c.last_message_at > now() - interval '2 days')
"""


@dataclass(frozen=True, slots=True)
class Notification:
    """One event and its webhook delivery, with what the event tells about the conversation."""

    id: int
    type: str
    conversation_id: int
    waiting_since: datetime
    created_at: datetime
    status: str
    attempts: int
    next_attempt_at: datetime
    last_status_code: int | None
    last_error: str | None
    delivered_at: datetime | None
    agent: str
    channel: str
    customer: str | None  # a name or a handle, never the conversation key (a phone number)


_COLUMNS = """n.id, n.type, n.conversation_id, n.waiting_since, n.created_at, n.status,
    n.attempts, n.next_attempt_at, n.last_status_code, n.last_error, n.delivered_at,
    a.slug AS agent, c.channel,
    coalesce(nullif(c.customer_name, ''), '@' || nullif(c.customer_handle, '')) AS customer"""
_FROM = """notifications n JOIN conversations c ON c.id = n.conversation_id
    JOIN agents a ON a.id = c.agent_id"""


def _row(row: asyncpg.Record) -> Notification:
    return Notification(**dict(row))


class Notifications:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def waiting_count(self, longer_than: float) -> int:
        """Conversations waiting for staff, or with a message unanswered ``longer_than``
        seconds: what the console's tab title counts."""
        found: int = await self._pool.fetchval(
            f"""SELECT count(*) FROM ({_WAITING}) w
                 WHERE w.asked OR w.since < now() - make_interval(secs => $2)""",
            list(UNREACHABLE),
            longer_than,
        )
        return found

    async def record_waiting(self, longer_than: float) -> int:
        """A `conversation.waiting` event for each wait longer than ``longer_than`` seconds
        that has none yet; returns how many were written."""
        result: str = await self._pool.execute(
            f"""INSERT INTO notifications (type, conversation_id, waiting_since)
                SELECT 'conversation.waiting', w.id, w.since FROM ({_WAITING}) w
                 WHERE w.since < now() - make_interval(secs => $2)
                ON CONFLICT DO NOTHING""",
            list(UNREACHABLE),
            longer_than,
        )
        return int(result.split()[-1])

    async def last_id(self) -> int:
        found: int | None = await self._pool.fetchval("SELECT max(id) FROM notifications")
        return found or 0

    async def since(self, after: int, limit: int = 20) -> list[Notification]:
        """Events after ``after``, oldest first."""
        rows = await self._pool.fetch(
            f"SELECT {_COLUMNS} FROM {_FROM} WHERE n.id > $1 ORDER BY n.id LIMIT $2",
            after,
            limit,
        )
        return [_row(r) for r in rows]

    async def recent(self, limit: int = 50) -> list[Notification]:
        """The newest events and their deliveries, newest first."""
        rows = await self._pool.fetch(
            f"SELECT {_COLUMNS} FROM {_FROM} ORDER BY n.id DESC LIMIT $1", limit
        )
        return [_row(r) for r in rows]

    async def claim(self, lease: float, limit: int = 10) -> list[Notification]:
        """Due deliveries, each counted as one more attempt and hidden from other senders for
        ``lease`` seconds (a sender that dies mid-send leaves it to be tried again then)."""
        async with self._pool.acquire() as conn, conn.transaction():
            ids = await conn.fetch(
                """UPDATE notifications SET attempts = attempts + 1,
                          next_attempt_at = now() + make_interval(secs => $1)
                    WHERE id IN (SELECT id FROM notifications
                                  WHERE status = 'pending' AND next_attempt_at <= now()
                                  ORDER BY next_attempt_at LIMIT $2
                                  FOR UPDATE SKIP LOCKED)
                RETURNING id""",
                lease,
                limit,
            )
            rows = await conn.fetch(
                f"SELECT {_COLUMNS} FROM {_FROM} WHERE n.id = ANY($1::bigint[]) ORDER BY n.id",
                [r["id"] for r in ids],
            )
        return [_row(r) for r in rows]

    async def record_attempt(
        self,
        item: Notification,
        *,
        status_code: int | None,
        error: str | None,
        retry_in: float | None,
    ) -> None:
        """What the claimed attempt of ``item`` gave: delivered when ``error`` is None; else
        tried again in ``retry_in`` seconds, or failed for good when that is None."""
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(
                """INSERT INTO notification_attempts (notification_id, attempt, status_code, error)
                   VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING""",
                item.id,
                item.attempts,
                status_code,
                error,
            )
            status = (
                "delivered" if error is None else "pending" if retry_in is not None else "failed"
            )
            await conn.execute(
                """UPDATE notifications SET status = $2, last_status_code = $3, last_error = $4,
                          delivered_at = CASE WHEN $2 = 'delivered' THEN now() END,
                          next_attempt_at = now() + make_interval(secs => $5)
                    WHERE id = $1""",
                item.id,
                status,
                status_code,
                error,
                retry_in or 0.0,
            )

    async def skip_due(self) -> int:
        """Due deliveries marked skipped: no webhook is configured to send them to."""
        result: str = await self._pool.execute(
            """UPDATE notifications SET status = 'skipped',
                      last_error = 'no webhook configured (PARLEY_NOTIFY_WEBHOOK)'
                WHERE status = 'pending' AND next_attempt_at <= now()"""
        )
        return int(result.split()[-1])

    async def attempts(self, notification_id: int) -> list[dict[str, Any]]:
        rows = await self._pool.fetch(
            """SELECT attempt, status_code, error, at FROM notification_attempts
                WHERE notification_id = $1 ORDER BY attempt""",
            notification_id,
        )
        return [dict(r) for r in rows]
