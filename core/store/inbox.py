"""The inbox: webhook deliveries written before the provider gets its 200, one per provider id."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias

import asyncpg

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy


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
_CANDIDATES = 50


def _claimable(alias: str) -> str:
    """Waiting, or held under a lease that ran out (its worker died)."""
    return (
        f"({alias}.status = 'pending'"
        f" OR ({alias}.status = 'processing' AND {alias}.lease_until < now()))"
    )


_CLAIMABLE = _claimable("inbox")
Connection: TypeAlias = "asyncpg.Connection | PoolConnectionProxy[Any]"


@dataclass(frozen=True, slots=True)
class InboxClaim:
    """One conversation's waiting rows, held under a lease until ``lease_until``."""

    rows: tuple[InboxRow, ...]
    lease_until: datetime  # the fencing token: whoever holds the rows' lease_until owns them

    @property
    def ids(self) -> list[int]:
        return [row.id for row in self.rows]

    @property
    def first(self) -> InboxRow:
        return self.rows[0]


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


class InboxLeases:
    """Claims waiting conversations under a lease and settles them; the lease is the fence.

    Every write after the claim names the rows *and* the ``lease_until`` it was given, so a
    worker whose lease ran out (and whose rows another worker took) changes nothing.
    """

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def claim(self, *, quiet_for: float, lease: float, max_rows: int) -> InboxClaim | None:
        """The oldest conversation whose newest waiting message is ``quiet_for`` seconds old."""
        async with self._pool.acquire() as conn, conn.transaction():
            # The oldest open messages of conversations that are ready: quiet for the burst
            # window and not being answered. Walking the received_at index stops after
            # _CANDIDATES rows, so a claim costs the same however long the backlog is.
            candidates = await conn.fetch(
                f"""SELECT agent_id, channel, conversation_key FROM (
                        SELECT i.agent_id, i.channel, i.conversation_key, i.received_at
                          FROM inbox i
                         WHERE i.status IN ('pending', 'processing') AND {_claimable("i")}
                           AND NOT EXISTS (
                               SELECT 1 FROM inbox n
                                WHERE n.agent_id = i.agent_id AND n.channel = i.channel
                                  AND n.conversation_key = i.conversation_key
                                  AND n.status IN ('pending', 'processing')
                                  AND ((n.status = 'processing' AND n.lease_until >= now())
                                       OR ({_claimable("n")} AND n.received_at
                                           > now() - make_interval(secs => $1))))
                         ORDER BY i.received_at
                         LIMIT {_CANDIDATES}) ready
                     GROUP BY agent_id, channel, conversation_key
                     ORDER BY min(received_at)
                     LIMIT 10""",
                quiet_for,
            )
            for candidate in candidates:
                claim = await _claim_conversation(
                    conn,
                    candidate["agent_id"],
                    candidate["channel"],
                    candidate["conversation_key"],
                    lease,
                    max_rows,
                )
                if claim is not None:
                    return claim
        return None

    async def renew(self, claim: InboxClaim, lease: float) -> InboxClaim | None:
        """The same claim with a later lease; None when it was lost."""
        renewed: datetime | None = await self._pool.fetchval(
            """UPDATE inbox SET lease_until = now() + make_interval(secs => $3)
                WHERE id = ANY($1::bigint[]) AND status = 'processing' AND lease_until = $2
            RETURNING lease_until""",
            claim.ids,
            claim.lease_until,
            lease,
        )
        return None if renewed is None else InboxClaim(claim.rows, renewed)

    async def release(self, claim: InboxClaim, error: str, max_attempts: int) -> None:
        """A failed turn: back to pending for another try, or failed for good."""
        await self._pool.execute(
            """UPDATE inbox SET attempts = attempts + 1, lease_until = NULL, error = $3,
                                status = CASE WHEN attempts + 1 >= $4 THEN 'failed'
                                              ELSE 'pending' END,
                                processed_at = CASE WHEN attempts + 1 >= $4 THEN now() END
                WHERE id = ANY($1::bigint[]) AND status = 'processing' AND lease_until = $2""",
            claim.ids,
            claim.lease_until,
            error[:500],
            max_attempts,
        )


async def complete(conn: Connection, claim: InboxClaim) -> bool:
    """Marks the claimed rows done inside the caller's transaction; False when the lease was
    lost (the caller then rolls back whatever it wrote with it)."""
    done = await conn.fetch(
        """UPDATE inbox SET status = 'done', processed_at = now(), lease_until = NULL, error = NULL
            WHERE id = ANY($1::bigint[]) AND status = 'processing' AND lease_until = $2
        RETURNING id""",
        claim.ids,
        claim.lease_until,
    )
    return len(done) == len(claim.rows)


async def newer_waiting(conn: Connection, claim: InboxClaim) -> bool:
    """True when the visitor wrote again after the claimed messages."""
    first = claim.first
    newer: bool = await conn.fetchval(
        """SELECT EXISTS (SELECT 1 FROM inbox
                           WHERE agent_id = $1 AND channel = $2 AND conversation_key = $3
                             AND status = 'pending' AND NOT (id = ANY($4::bigint[])))""",
        first.agent_id,
        first.channel,
        first.conversation_key,
        claim.ids,
    )
    return newer


async def put_back(conn: Connection, claim: InboxClaim) -> bool:
    """The claimed rows waiting again (to be answered with newer ones); False when lost."""
    released = await conn.fetch(
        """UPDATE inbox SET status = 'pending', processed_at = NULL, lease_until = NULL
            WHERE id = ANY($1::bigint[]) AND status = 'processing' AND lease_until = $2
        RETURNING id""",
        claim.ids,
        claim.lease_until,
    )
    return len(released) == len(claim.rows)


async def _claim_conversation(
    conn: Connection, agent_id: int, channel: str, key: str, lease: float, max_rows: int
) -> InboxClaim | None:
    # Row locks alone cannot keep two workers off one conversation (each could lock a
    # different message of it); a per-conversation lock, held to commit, can.
    locked = await conn.fetchval(
        "SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))",
        f"inbox:{agent_id}:{channel}:{key}",
    )
    if not locked:
        return None
    busy = await conn.fetchval(
        """SELECT EXISTS (SELECT 1 FROM inbox
            WHERE agent_id = $1 AND channel = $2 AND conversation_key = $3
              AND status = 'processing' AND lease_until >= now())""",
        agent_id,
        channel,
        key,
    )
    if busy:
        return None
    rows = await conn.fetch(
        f"""SELECT {_COLUMNS} FROM inbox
             WHERE agent_id = $1 AND channel = $2 AND conversation_key = $3 AND {_CLAIMABLE}
             ORDER BY received_at, id
             LIMIT $4
             FOR UPDATE SKIP LOCKED""",
        agent_id,
        channel,
        key,
        max_rows,
    )
    if not rows:
        return None
    lease_until: datetime = await conn.fetchval(
        """UPDATE inbox SET status = 'processing', lease_until = now() + make_interval(secs => $2)
            WHERE id = ANY($1::bigint[])
        RETURNING lease_until""",
        [r["id"] for r in rows],
        lease,
    )
    return InboxClaim(tuple(InboxRow(**dict(r)) for r in rows), lease_until)
