"""The inbox: webhook deliveries written before the provider gets its 200, one per provider id."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias

import asyncpg

from core.inbound import InboundMessage
from core.store.inbox_writer import InboxWriter

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
    message: Mapping[str, Any]
    status: str
    attempts: int
    received_at: datetime

    @property
    def inbound(self) -> InboundMessage:
        """The message as its channel normalised it (``payload`` is the provider's own)."""
        return InboundMessage.from_json(self.message)


_COLUMNS = ", ".join(InboxRow.__dataclass_fields__)
_CANDIDATES = 50
_OPEN = "status IN ('pending', 'processing')"


@dataclass(frozen=True, slots=True)
class Backoff:
    """How a turn that failed on a service that was down is tried again.

    The n-th retry waits ``base * 2**(n-1)`` seconds, at most ``cap``, times a random factor
    between 0.5 and 1 (so rows that failed together do not all return at once). A row that
    has waited ``limit`` seconds since it came in (or was taken up again) fails instead.
    """

    base: float = 1.0
    cap: float = 120.0
    limit: float = 6 * 3600.0


@dataclass(frozen=True, slots=True)
class ConversationRef:
    agent_id: int
    channel: str
    conversation_key: str


@dataclass(frozen=True, slots=True)
class Holding:
    """A conversation whose customer is to be told to hold on, once, now."""

    rows: tuple[InboxRow, ...]  # its open messages, oldest first
    conversation_id: int | None
    conversation_language: str | None


@dataclass(frozen=True, slots=True)
class TroubledRow:
    """A message staff should know about: failed, or waiting longer than it should."""

    id: int
    agent_id: int
    agent: str  # the agent's slug
    channel: str
    conversation_key: str
    conversation_id: int | None
    payload: Mapping[str, Any]
    message: Mapping[str, Any]
    status: str
    attempts: int
    error: str | None
    received_at: datetime
    next_attempt_at: datetime
    requeued_at: datetime | None
    holding_sent_at: datetime | None
    processed_at: datetime | None


def _claimable(alias: str) -> str:
    """Waiting and due (not backing off after a failure), or held under a lease that ran out
    (its worker died)."""
    return (
        f"(({alias}.status = 'pending' AND {alias}.next_attempt_at <= now())"
        f" OR ({alias}.status = 'processing' AND {alias}.lease_until < now()))"
    )


def _busy(alias: str) -> str:
    """Being answered, or backing off after a failure: the conversation waits as a whole, so
    a newer message is never answered before an older one."""
    return (
        f"(({alias}.status = 'processing' AND {alias}.lease_until >= now())"
        f" OR ({alias}.status = 'pending' AND {alias}.next_attempt_at > now()))"
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
    """Adds deliveries idempotently, and shows staff what is stuck or failed and takes it up
    again; the workers that claim and answer them live elsewhere."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._writer = InboxWriter(pool)

    async def add(
        self,
        agent_id: int,
        channel: str,
        message: InboundMessage,
        payload: Mapping[str, Any],
    ) -> bool:
        """Store one delivery, normalised and as sent (``payload``, kept for staff); False
        when this provider id was stored before (a re-delivery). Deliveries added at the
        same moment share a statement (`core.store.inbox_writer`); each returns once its
        row is committed."""
        return await self._writer.add(agent_id, channel, message, payload)

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

    async def troubled(
        self,
        *,
        stuck_after: float,
        failed: bool = True,
        stuck: bool = True,
        agent_id: int | None = None,
        limit: int = 200,
    ) -> list[TroubledRow]:
        """Failed messages, and open ones that failed before or have waited longer than
        ``stuck_after`` seconds; newest first."""
        rows = await self._pool.fetch(
            """SELECT i.id, i.agent_id, a.slug AS agent, i.channel, i.conversation_key,
                      c.id AS conversation_id, i.payload, i.message, i.status, i.attempts, i.error,
                      i.received_at, i.next_attempt_at, i.requeued_at, i.holding_sent_at,
                      i.processed_at
                 FROM inbox i
                 JOIN agents a ON a.id = i.agent_id
                 LEFT JOIN conversations c ON c.agent_id = i.agent_id AND c.channel = i.channel
                                          AND c.conversation_key = i.conversation_key
                WHERE ($1::bigint IS NULL OR i.agent_id = $1)
                  AND (($2 AND i.status = 'failed')
                       OR ($3 AND i.status IN ('pending', 'processing')
                           AND (i.attempts > 0 OR coalesce(i.requeued_at, i.received_at)
                                                  < now() - make_interval(secs => $4))))
                ORDER BY i.received_at DESC, i.id DESC
                LIMIT $5""",
            agent_id,
            failed,
            stuck,
            stuck_after,
            limit,
        )
        return [TroubledRow(**dict(r)) for r in rows]

    async def retry(self, ids: Sequence[int] | None = None, *, agent_id: int | None = None) -> int:
        """Take messages up again now: failed ones (counting their time limit and attempts
        afresh) and ones backing off after a failure. Without ``ids``, every such message
        (of ``agent_id``'s, when given). Returns how many."""
        result = await self._pool.execute(
            """UPDATE inbox
                  SET requeued_at = CASE WHEN status = 'failed' THEN now() ELSE requeued_at END,
                      attempts = CASE WHEN status = 'failed' THEN 0 ELSE attempts END,
                      status = 'pending', next_attempt_at = now(), lease_until = NULL,
                      processed_at = NULL
                WHERE (status = 'failed' OR (status = 'pending' AND next_attempt_at > now()))
                  AND ($1::bigint[] IS NULL OR id = ANY($1::bigint[]))
                  AND ($2::bigint IS NULL OR agent_id = $2)""",
            list(ids) if ids is not None else None,
            agent_id,
        )
        return int(result.split()[-1])


class InboxLeases:
    """Claims waiting conversations under a lease and settles them; the lease is the fence.

    Every write after the claim names the rows *and* the ``lease_until`` it was given, so a
    worker whose lease ran out (and whose rows another worker took) changes nothing.
    """

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def claim(
        self,
        *,
        quiet_for: float,
        lease: float,
        max_rows: int,
        skip_agents: Sequence[int] = (),
    ) -> InboxClaim | None:
        """The oldest conversation whose newest waiting message is ``quiet_for`` seconds old."""
        claims = await self.claim_many(
            1, quiet_for=quiet_for, lease=lease, max_rows=max_rows, skip_agents=skip_agents
        )
        return claims[0] if claims else None

    async def claim_many(
        self,
        count: int,
        *,
        quiet_for: float,
        lease: float,
        max_rows: int,
        skip_agents: Sequence[int] = (),
    ) -> list[InboxClaim]:
        """Up to ``count`` conversations whose newest waiting message is ``quiet_for`` seconds
        old, oldest first, in one transaction; none of ``skip_agents``' (their answers are
        waiting for the model's limits already)."""
        claims: list[InboxClaim] = []
        async with self._pool.acquire() as conn, conn.transaction():
            # The oldest open messages of conversations that are ready: quiet for the burst
            # window, not being answered and not backing off. Walking the received_at index
            # stops after a bounded number of ready rows, so a claim costs the same however
            # long the backlog of ready rows is; rows backing off after an outage are stepped
            # over on the way, a cost that ends with the outage.
            candidates = await conn.fetch(
                f"""SELECT agent_id, channel, conversation_key FROM (
                        SELECT i.agent_id, i.channel, i.conversation_key, i.received_at
                          FROM inbox i
                         WHERE i.status IN ('pending', 'processing') AND {_claimable("i")}
                           AND NOT (i.agent_id = ANY($2::bigint[]))
                           AND NOT EXISTS (
                               SELECT 1 FROM inbox n
                                WHERE n.agent_id = i.agent_id AND n.channel = i.channel
                                  AND n.conversation_key = i.conversation_key
                                  AND n.status IN ('pending', 'processing')
                                  AND ({_busy("n")}
                                       OR ({_claimable("n")} AND n.received_at
                                           > now() - make_interval(secs => $1))))
                         ORDER BY i.received_at
                         LIMIT $3) ready
                     GROUP BY agent_id, channel, conversation_key
                     ORDER BY min(received_at)
                     LIMIT $4""",
                quiet_for,
                list(skip_agents),
                max(_CANDIDATES, 5 * count),
                count + 10,  # a few to spare for those another worker takes meanwhile
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
                    claims.append(claim)
                    if len(claims) == count:
                        break
        return claims

    async def give_back(self, claim: InboxClaim) -> bool:
        """The claimed rows waiting again at once, no attempt counted: the worker stops before
        it could answer them. False when the lease was lost (they are someone else's)."""
        async with self._pool.acquire() as conn:
            return await put_back(conn, claim)

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

    async def release(self, claim: InboxClaim, error: str, retry: Backoff | None) -> int:
        """A failed turn: its rows wait ``retry``'s back-off and are tried again, or (without
        ``retry``, or past its time limit) fail for good. Returns how many failed."""
        failed = await self._pool.fetchval(
            """WITH pause AS (
                   SELECT least($5::float8, $4::float8 * power(2, least(max(attempts), 30)))
                          * (0.5 + random() / 2) AS secs
                     FROM inbox WHERE id = ANY($1::bigint[])),
               settled AS (
                   UPDATE inbox
                      SET attempts = attempts + 1, lease_until = NULL, error = $3,
                          status = CASE WHEN $4 IS NULL OR coalesce(requeued_at, received_at)
                                             < now() - make_interval(secs => $6)
                                        THEN 'failed' ELSE 'pending' END,
                          processed_at = CASE WHEN $4 IS NULL OR coalesce(requeued_at, received_at)
                                                   < now() - make_interval(secs => $6)
                                              THEN now() END,
                          next_attempt_at = now() + make_interval(secs => coalesce(pause.secs, 0))
                     FROM pause
                    WHERE id = ANY($1::bigint[]) AND status = 'processing' AND lease_until = $2
                RETURNING status)
               SELECT count(*) FILTER (WHERE status = 'failed') FROM settled""",
            claim.ids,
            claim.lease_until,
            error[:500],
            retry.base if retry is not None else None,
            retry.cap if retry is not None else 0.0,
            retry.limit if retry is not None else 0.0,
        )
        return int(failed or 0)

    async def overdue(self, after: float, limit: int = 20) -> list[ConversationRef]:
        """Conversations with a message waiting ``after`` seconds (since it came in, or was
        taken up again) whose customer has not been told to hold on."""
        rows = await self._pool.fetch(
            """SELECT DISTINCT agent_id, channel, conversation_key FROM (
                   SELECT agent_id, channel, conversation_key FROM inbox
                    WHERE status IN ('pending', 'processing') AND holding_sent_at IS NULL
                      AND received_at < now() - make_interval(secs => $1)
                      AND coalesce(requeued_at, received_at) < now() - make_interval(secs => $1)
                    ORDER BY received_at
                    LIMIT $2) overdue""",
            after,
            limit,
        )
        return [ConversationRef(r["agent_id"], r["channel"], r["conversation_key"]) for r in rows]


async def hold(conn: Connection, conversation: ConversationRef, after: float) -> Holding | None:
    """Inside the caller's transaction: the conversation's open messages, marked as told to
    hold on, when the holding message is due now; None when it went out before for these
    messages (the newer ones are then marked as covered by it) or is not due.

    Once per waiting turn: a message that arrives while the customer has been told to hold
    on is answered in the same turn, so it needs no holding message of its own.
    """
    key = f"inbox-holding:{conversation.agent_id}:{conversation.channel}"
    await conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
        f"{key}:{conversation.conversation_key}",
    )
    where = f"agent_id = $1 AND channel = $2 AND conversation_key = $3 AND {_OPEN}"
    state = await conn.fetchrow(
        f"""SELECT bool_or(holding_sent_at IS NOT NULL) AS told,
                   bool_or(coalesce(requeued_at, received_at)
                           < now() - make_interval(secs => $4)) AS due
              FROM inbox WHERE {where}""",
        conversation.agent_id,
        conversation.channel,
        conversation.conversation_key,
        after,
    )
    if state is None or not (state["told"] or state["due"]):
        return None
    rows = await conn.fetch(
        f"""UPDATE inbox SET holding_sent_at = now()
             WHERE {where} AND holding_sent_at IS NULL
         RETURNING {_COLUMNS}""",
        conversation.agent_id,
        conversation.channel,
        conversation.conversation_key,
    )
    if state["told"] or not rows:
        # None marked: answered (or failed) since the look above, which saw them still open;
        # a holding message now would follow the answer.
        return None
    found = await conn.fetchrow(
        """SELECT id, language FROM conversations
            WHERE agent_id = $1 AND channel = $2 AND conversation_key = $3""",
        conversation.agent_id,
        conversation.channel,
        conversation.conversation_key,
    )
    ordered = sorted((InboxRow(**dict(r)) for r in rows), key=lambda r: (r.received_at, r.id))
    return Holding(
        tuple(ordered),
        found["id"] if found else None,
        found["language"] if found else None,
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
        f"""SELECT EXISTS (SELECT 1 FROM inbox
            WHERE agent_id = $1 AND channel = $2 AND conversation_key = $3
              AND status IN ('pending', 'processing') AND {_busy("inbox")})""",
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
