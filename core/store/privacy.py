"""Privacy requests in Postgres: one customer's data erased or exported, and the audit of it.

A customer is an agent's channel and the channel's own id of them (`conversation_key`: a
widget session id, ``whatsapp:+316...``, a Telegram chat id), matched exactly, so erasing
``whatsapp:+3161234`` never touches ``whatsapp:+31612345``. Usage rows are daily totals
per channel with nothing of anyone in them, and stay. Media (voice notes, images) is never
stored here: it is fetched from the provider, transcribed and dropped, so there is none to
erase. The Redis memory of a conversation is the caller's to forget (`core.privacy`).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Literal

import asyncpg

from core.store.database import Connection

Action = Literal["erase", "export"]


@dataclass(frozen=True, slots=True)
class Erased:
    """How many rows of each kind an erasure removed."""

    conversations: int = 0
    messages: int = 0
    summaries: int = 0
    turns: int = 0
    content_gaps: int = 0
    feedback: int = 0
    inbox: int = 0
    outbox: int = 0

    @property
    def total(self) -> int:
        return sum(asdict(self).values())


@dataclass(frozen=True, slots=True)
class Erasure:
    erased: Erased
    conversation_ids: tuple[int, ...]  # gone from Postgres; their cached memory is next
    customer_hash: str


@dataclass(frozen=True, slots=True)
class ExportedMessage:
    role: str
    text: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class ExportedTurn:
    query: str
    rewritten_query: str | None
    confidence: float | None
    mode: str
    trace: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class ExportedConversation:
    id: int
    channel: str
    customer_name: str | None
    language: str | None
    status: str
    created_at: datetime
    last_message_at: datetime
    summary: str | None
    messages: tuple[ExportedMessage, ...]
    turns: tuple[ExportedTurn, ...] | None  # only when traces were asked for


@dataclass(frozen=True, slots=True)
class AuditEntry:
    id: int
    action: str
    staff: str
    agent: str
    channel: str
    customer_hash: str
    counts: dict[str, int] = field(default_factory=dict)
    created_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Customer:
    """One customer of one agent on one channel: the channel's own id of them."""

    agent_id: int
    agent: str  # the agent's slug, as the audit log records it
    channel: str
    id: str


def _count(status: str) -> int:
    return int(status.split()[-1])


class Privacy:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def erase(self, customer: Customer, *, staff: str) -> Erasure:
        """Delete everything of one customer of one agent on one channel, in one transaction
        that also writes the audit row: either all of it is gone and recorded, or nothing."""
        async with self._pool.acquire() as conn, conn.transaction():
            ids: list[int] = [
                r["id"]
                for r in await conn.fetch(
                    """SELECT id FROM conversations
                        WHERE agent_id = $1 AND channel = $2 AND conversation_key = $3
                        ORDER BY id FOR UPDATE""",
                    customer.agent_id,
                    customer.channel,
                    customer.id,
                )
            ]
            turn_ids: list[int] = [
                r["id"]
                for r in await conn.fetch(
                    "SELECT id FROM turns WHERE conversation_id = ANY($1::bigint[])", ids
                )
            ]
            # A gap quotes the customer's question: by its turn, or, when the turn is gone
            # already (its gap then points nowhere), by the very words they wrote.
            gaps = _count(
                await conn.execute(
                    """DELETE FROM content_gaps
                        WHERE turn_id = ANY($1::bigint[])
                           OR (agent_id = $2 AND turn_id IS NULL AND question IN (
                                SELECT text FROM messages
                                 WHERE conversation_id = ANY($3::bigint[])
                                   AND role = 'visitor'))""",
                    turn_ids,
                    customer.agent_id,
                    ids,
                )
            )
            feedback = _count(
                await conn.execute(
                    "DELETE FROM feedback WHERE conversation_id = ANY($1::bigint[])", ids
                )
            )
            outbox = _count(
                await conn.execute(
                    """DELETE FROM outbox
                        WHERE agent_id = $1 AND channel = $2
                          AND (conversation_id = ANY($3::bigint[]) OR recipient = $4)""",
                    customer.agent_id,
                    customer.channel,
                    ids,
                    customer.id,
                )
            )
            inbox = _count(
                await conn.execute(
                    """DELETE FROM inbox
                        WHERE agent_id = $1 AND channel = $2 AND conversation_key = $3""",
                    customer.agent_id,
                    customer.channel,
                    customer.id,
                )
            )
            summaries = _count(
                await conn.execute(
                    "DELETE FROM summaries WHERE conversation_id = ANY($1::bigint[])", ids
                )
            )
            messages = _count(
                await conn.execute(
                    "DELETE FROM messages WHERE conversation_id = ANY($1::bigint[])", ids
                )
            )
            turns = _count(
                await conn.execute(
                    "DELETE FROM turns WHERE conversation_id = ANY($1::bigint[])", ids
                )
            )
            # What else hangs off a conversation (notes, labels) goes with it by cascade.
            conversations = _count(
                await conn.execute("DELETE FROM conversations WHERE id = ANY($1::bigint[])", ids)
            )
            erased = Erased(
                conversations=conversations,
                messages=messages,
                summaries=summaries,
                turns=turns,
                content_gaps=gaps,
                feedback=feedback,
                inbox=inbox,
                outbox=outbox,
            )
            hashed = await _audit(conn, "erase", staff, customer, asdict(erased))
        return Erasure(erased=erased, conversation_ids=tuple(ids), customer_hash=hashed)

    async def export(
        self, customer: Customer, *, staff: str, traces: bool = False
    ) -> list[ExportedConversation]:
        """The customer's conversations with the agent on the channel, oldest first: the
        messages with who wrote them and when, the summary and the status; the turns'
        traces (what was searched and found) only when ``traces``. Audited as an export."""
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                """SELECT c.id, c.channel, c.customer_name, c.language, c.status, c.created_at,
                          c.last_message_at, s.text AS summary
                     FROM conversations c
                     LEFT JOIN summaries s ON s.conversation_id = c.id
                    WHERE c.agent_id = $1 AND c.channel = $2 AND c.conversation_key = $3
                    ORDER BY c.id""",
                customer.agent_id,
                customer.channel,
                customer.id,
            )
            ids = [r["id"] for r in rows]
            messages: dict[int, list[ExportedMessage]] = {i: [] for i in ids}
            for m in await conn.fetch(
                """SELECT conversation_id, role, text, created_at FROM messages
                    WHERE conversation_id = ANY($1::bigint[]) ORDER BY id""",
                ids,
            ):
                messages[m["conversation_id"]].append(
                    ExportedMessage(m["role"], m["text"], m["created_at"])
                )
            turns: dict[int, list[ExportedTurn]] = {i: [] for i in ids}
            if traces:
                for t in await conn.fetch(
                    """SELECT conversation_id, query, rewritten_query, confidence, mode, trace,
                              created_at
                         FROM turns WHERE conversation_id = ANY($1::bigint[]) ORDER BY id""",
                    ids,
                ):
                    trace = t["trace"] or {}
                    turns[t["conversation_id"]].append(
                        ExportedTurn(
                            query=t["query"],
                            rewritten_query=t["rewritten_query"],
                            confidence=t["confidence"],
                            mode=t["mode"],
                            trace=dict(trace),
                            created_at=t["created_at"],
                        )
                    )
            counts = {
                "conversations": len(ids),
                "messages": sum(len(v) for v in messages.values()),
            }
            await _audit(conn, "export", staff, customer, counts)
        return [
            ExportedConversation(
                id=r["id"],
                channel=r["channel"],
                customer_name=r["customer_name"],
                language=r["language"],
                status=r["status"],
                created_at=r["created_at"],
                last_message_at=r["last_message_at"],
                summary=r["summary"],
                messages=tuple(messages[r["id"]]),
                turns=tuple(turns[r["id"]]) if traces else None,
            )
            for r in rows
        ]

    async def audit(self, agent: str, *, limit: int = 50) -> list[AuditEntry]:
        """The agent's privacy requests, newest first."""
        rows = await self._pool.fetch(
            """SELECT id, action, staff, agent, channel, customer_hash, counts, created_at
                 FROM privacy_audit WHERE agent = $1 ORDER BY id DESC LIMIT $2""",
            agent,
            limit,
        )
        return [
            AuditEntry(
                id=r["id"],
                action=r["action"],
                staff=r["staff"],
                agent=r["agent"],
                channel=r["channel"],
                customer_hash=r["customer_hash"],
                counts=r["counts"],
                created_at=r["created_at"],
            )
            for r in rows
        ]


async def _audit(
    conn: Connection, action: Action, staff: str, customer: Customer, counts: dict[str, int]
) -> str:
    """Record the request by a keyed hash of the customer, never their id; returns the hash."""
    key = bytes(await conn.fetchval("SELECT key FROM privacy_key"))
    customer_hash = hmac.new(
        key, f"{customer.channel}\x00{customer.id}".encode(), hashlib.sha256
    ).hexdigest()
    await conn.execute(
        """INSERT INTO privacy_audit (action, staff, agent, channel, customer_hash, counts)
           VALUES ($1, $2, $3, $4, $5, $6)""",
        action,
        staff,
        customer.agent,
        customer.channel,
        customer_hash,
        counts,  # the pool's codec writes it as JSON
    )
    return customer_hash
