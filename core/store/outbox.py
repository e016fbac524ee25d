"""The outbox: reply parts waiting to be sent, claimed with a lease and sent in order per chat."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from core.delivery import Choice


@dataclass(frozen=True, slots=True)
class OutboxRow:
    id: int
    agent_id: int
    channel: str
    conversation_id: int | None
    message_id: int | None
    recipient: str
    part: int
    body: str
    status: str
    attempts: int
    provider_message_id: str | None
    error_code: str | None
    error_message: str | None
    # When the latest attempt was claimed.
    attempt_started_at: datetime | None
    # Set while an earlier attempt may have been accepted without its answer reaching us: when
    # the earliest such attempt began. Before sending again, ask the provider from then on.
    unconfirmed_since: datetime | None
    # Look-ups of an unconfirmed part that failed in a row.
    lookups: int
    # An approved template sent instead of ``body`` (which holds its text, filled in):
    # {"name", "provider_id", "language", "values"}.
    template: Mapping[str, Any] | None = None
    # Buttons sent under the part (`core.delivery.Choice`): [{"label", "data"}].
    choices: Sequence[Mapping[str, Any]] | None = None


# A part left 'sending' by a sender that died may have reached the provider: from when.
_DIED_MID_SEND = "COALESCE(outbox.unconfirmed_since, outbox.attempt_started_at, outbox.created_at)"

_COLUMNS = ", ".join(OutboxRow.__dataclass_fields__)


async def enqueue(
    conn: asyncpg.Connection[Any] | PoolConnectionProxy[Any],
    *,
    agent_id: int,
    channel: str,
    recipient: str,
    parts: Sequence[str],
    conversation_id: int | None = None,
    message_id: int | None = None,
    template: Mapping[str, Any] | None = None,
    choices: Sequence[Choice] = (),
) -> list[int]:
    """Add one reply's parts (already split by the channel) on ``conn``, inside its
    transaction; with ``template``, one part: the template, ``parts[0]`` its text. ``choices``
    go under the last part."""
    ids: list[int] = []
    sent = parts[:1] if template is not None else parts
    buttons = [{"label": c.label, "data": c.data} for c in choices] or None
    for number, body in enumerate(sent):
        ids.append(
            await conn.fetchval(
                """INSERT INTO outbox (agent_id, channel, conversation_id, message_id, recipient,
                                       part, body, template, choices)
                   VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id""",
                agent_id,
                channel,
                conversation_id,
                message_id,
                recipient,
                number,
                body,
                dict(template) if template is not None else None,
                buttons if number == len(sent) - 1 else None,
            )
        )
    return ids


class Outbox:
    """Claims, and records the fate of, outbox rows; `enqueue` adds them."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def claim(self, limit: int, lease: float) -> list[OutboxRow]:
        """Due rows, leased for ``lease`` seconds, at most one per chat.

        A row is due when it is pending and its time has come, or its sending lease has
        expired (the sender died). A row waits while an earlier row for the same chat is still
        unsent, so parts (and replies) go out in order. ``attempts`` counts claims, so a sender
        that keeps dying on a row still gives up on it in the end.

        A claim records when the attempt began (``attempt_started_at``). A row taken back from
        a sender that died while sending it becomes unconfirmed: that sender may have sent it.
        """
        rows = await self._pool.fetch(
            f"""WITH due AS (
                    SELECT o.id FROM outbox o
                     WHERE ((o.status = 'pending' AND o.next_attempt_at <= now())
                            OR (o.status = 'sending' AND o.lease_until < now()))
                       AND NOT EXISTS (
                           SELECT 1 FROM outbox e
                            WHERE e.agent_id = o.agent_id AND e.channel = o.channel
                              AND e.recipient = o.recipient AND e.id < o.id
                              AND e.status IN ('pending', 'sending'))
                     ORDER BY o.id
                     LIMIT $1
                     FOR UPDATE SKIP LOCKED)
                UPDATE outbox SET status = 'sending', attempts = outbox.attempts + 1,
                                  lease_until = now() + make_interval(secs => $2),
                                  attempt_started_at = now(),
                                  unconfirmed_since = CASE WHEN outbox.status = 'sending'
                                                           THEN {_DIED_MID_SEND}
                                                           ELSE outbox.unconfirmed_since END
                  FROM due WHERE outbox.id = due.id
                RETURNING {", ".join("outbox." + c for c in OutboxRow.__dataclass_fields__)}""",
            limit,
            lease,
        )
        return sorted((OutboxRow(**dict(r)) for r in rows), key=lambda r: r.id)

    async def mark_sent(self, row_id: int, provider_message_id: str) -> None:
        """Accepted by the provider under ``provider_message_id`` (sent now, or found sent by
        a look-up after an attempt whose answer never came)."""
        await self._pool.execute(
            """UPDATE outbox SET status = 'sent', provider_message_id = $2, sent_at = now(),
                                 lease_until = NULL, error_code = NULL, error_message = NULL,
                                 unconfirmed_since = NULL, lookups = 0
                WHERE id = $1""",
            row_id,
            provider_message_id,
        )

    async def recorded(
        self, channel: str, recipient: str, provider_message_ids: Sequence[str]
    ) -> set[str]:
        """Which of these provider ids already belong to a part of this chat (a look-up must
        not adopt a message another part was recorded with)."""
        rows = await self._pool.fetch(
            """SELECT provider_message_id FROM outbox
                WHERE channel = $1 AND recipient = $2 AND provider_message_id = ANY($3::text[])""",
            channel,
            recipient,
            list(provider_message_ids),
        )
        return {r["provider_message_id"] for r in rows}

    async def agents_of(self, channel: str, provider_message_id: str) -> list[int]:
        """The agents whose parts were sent as ``provider_message_id``."""
        rows = await self._pool.fetch(
            """SELECT DISTINCT agent_id FROM outbox
                WHERE provider_message_id = $2 AND channel = $1 ORDER BY agent_id""",
            channel,
            provider_message_id,
        )
        return [r["agent_id"] for r in rows]

    async def record_status(
        self,
        channel: str,
        provider_message_id: str,
        status: str,
        error_code: str | None,
        *,
        agent_ids: Sequence[int],
    ) -> bool:
        """A provider's delivery report, for a message one of ``agent_ids`` sent (the agents
        whose credentials the report was verified with). Reports arrive out of order, so a
        message only moves forward (sent -> delivered -> read) and never leaves a final state;
        True if applied."""
        result = await self._pool.execute(
            """UPDATE outbox SET status = $3, error_code = COALESCE($4, error_code)
                WHERE channel = $1 AND provider_message_id = $2
                  AND agent_id = ANY($5::bigint[])
                  AND status NOT IN ('read', 'failed', 'undelivered')
                  AND NOT (status = 'delivered' AND $3 <> 'read')
                  AND NOT (status = 'sent' AND $3 IN ('pending', 'sending'))""",
            channel,
            provider_message_id,
            status,
            error_code,
            list(agent_ids),
        )
        return result != "UPDATE 0"

    async def mark_failed(self, row_id: int, code: str | None, message: str) -> None:
        """Never to be retried: the provider refused it for good, or attempts ran out."""
        await self._pool.execute(
            """UPDATE outbox SET status = 'failed', error_code = $2, error_message = $3,
                                 lease_until = NULL
                WHERE id = $1""",
            row_id,
            code,
            message,
        )

    async def reschedule(
        self,
        row_id: int,
        delay: float,
        code: str | None,
        message: str,
        *,
        unconfirmed_since: datetime | None = None,
    ) -> None:
        """Back to pending, due again in ``delay`` seconds (the attempt was counted at claim).

        ``unconfirmed_since``: the attempt that failed may have been accepted all the same
        (its start), so the next one asks the provider first; None when nothing is in doubt.
        """
        await self._pool.execute(
            """UPDATE outbox SET status = 'pending', lease_until = NULL,
                                 next_attempt_at = now() + make_interval(secs => $2),
                                 error_code = $3, error_message = $4,
                                 unconfirmed_since = $5, lookups = 0
                WHERE id = $1""",
            row_id,
            delay,
            code,
            message,
            unconfirmed_since,
        )

    async def retry_lookup(self, row_id: int, delay: float, code: str | None, message: str) -> None:
        """The look-up of an unconfirmed part failed: due again in ``delay`` seconds, still
        unconfirmed, one failed look-up more."""
        await self._pool.execute(
            """UPDATE outbox SET status = 'pending', lease_until = NULL,
                                 next_attempt_at = now() + make_interval(secs => $2),
                                 error_code = $3, error_message = $4, lookups = lookups + 1
                WHERE id = $1""",
            row_id,
            delay,
            code,
            message,
        )

    async def rows(self, agent_id: int) -> list[OutboxRow]:
        """An agent's outbox, oldest first (for tests and the admin)."""
        rows = await self._pool.fetch(
            f"SELECT {_COLUMNS} FROM outbox WHERE agent_id = $1 ORDER BY id", agent_id
        )
        return [OutboxRow(**dict(r)) for r in rows]

    async def expire_unsent(self, older_than: float) -> int:
        """Fail the rows still unsent ``older_than`` seconds after they were queued: a reply
        that late would confuse more than help, and it holds up the chat's later replies."""
        reason = f"not sent within {older_than / 3600:g} hours of being queued; given up"
        result = await self._pool.execute(
            """UPDATE outbox SET status = 'failed', lease_until = NULL, error_code = 'expired',
                                 error_message = $2 || coalesce(' (last error: '
                                                                || error_message || ')', '')
                WHERE created_at < now() - make_interval(secs => $1)
                  AND (status = 'pending' OR (status = 'sending' AND lease_until < now()))""",
            older_than,
            reason,
        )
        return int(result.split()[-1])

    async def release_expired_leases(self) -> int:
        """Rows left 'sending' by a sender that died back to 'pending', due now, so that
        staff see them as waiting; `claim` would also take them, but only while a sender runs.
        They are unconfirmed: the sender may have sent them before it died."""
        result = await self._pool.execute(
            f"""UPDATE outbox SET status = 'pending', lease_until = NULL, next_attempt_at = now(),
                                  unconfirmed_since = {_DIED_MID_SEND}
                 WHERE status = 'sending' AND lease_until < now()"""
        )
        return int(result.split()[-1])
