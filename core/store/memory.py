"""Conversation memory in Postgres: a generation's recent messages, its summary, the
conversation's topic, and clearing."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from core.store.conversations import StoredMessage

# What memory remembers: what the visitor, the bot and staff said, not system notes.
MEMORY_ROLES = ["visitor", "assistant", "staff"]
# Of what the customer wrote before the first reply, the topic reads this many messages.
TOPIC_MESSAGES = 5


@dataclass(frozen=True, slots=True)
class StoredMemory:
    """A conversation's memory as Postgres holds it now."""

    generation: int
    messages: tuple[StoredMessage, ...]  # the newest, oldest first
    summary: str | None
    through: int | None  # the last message id the summary covers


@dataclass(frozen=True, slots=True)
class SummaryWork:
    """What bringing a summary up to date takes: the summary so far and what it misses."""

    conversation_id: int
    generation: int
    previous: str | None
    through: int | None
    fallen_out: tuple[StoredMessage, ...]  # left the recent window, not yet summarised


@dataclass(frozen=True, slots=True)
class TopicWork:
    """What naming a conversation takes: its first exchange, while it has no topic."""

    conversation_id: int
    question: str  # what the customer wrote before the first reply, one message a line
    answer: str  # that reply (the bot's, or staff's)
    language: str | None


class MemoryStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def load(self, conversation_id: int, limit: int) -> StoredMemory | None:
        """The last ``limit`` messages and the summary of the current generation, in one query."""
        rows = await self._pool.fetch(
            """SELECT c.generation, s.text AS summary, s.through_message,
                      m.id, m.role, m.text
                 FROM conversations c
                 LEFT JOIN summaries s
                        ON s.conversation_id = c.id AND s.generation = c.generation
                 LEFT JOIN LATERAL (
                       SELECT id, role, text FROM messages
                        WHERE conversation_id = c.id AND generation = c.generation
                          AND role = ANY($3::text[])
                        ORDER BY id DESC LIMIT $2) m ON true
                WHERE c.id = $1
                ORDER BY m.id""",
            conversation_id,
            limit,
            MEMORY_ROLES,
        )
        if not rows:
            return None
        first = rows[0]
        return StoredMemory(
            generation=first["generation"],
            messages=tuple(
                StoredMessage(r["id"], r["role"], r["text"]) for r in rows if r["id"] is not None
            ),
            summary=first["summary"],
            through=first["through_message"],
        )

    async def summary_work(self, conversation_id: int, window: int, lag: int) -> SummaryWork | None:
        """The work when ``lag`` or more messages have left the last ``window`` unsummarised."""
        head = await self._pool.fetchrow(
            """SELECT c.generation, s.text AS summary, s.through_message,
                      (SELECT count(*) FROM messages m
                        WHERE m.conversation_id = c.id AND m.generation = c.generation
                          AND m.role = ANY($2::text[])
                          AND m.id > COALESCE(s.through_message, 0)) AS uncovered
                 FROM conversations c
                 LEFT JOIN summaries s
                        ON s.conversation_id = c.id AND s.generation = c.generation
                WHERE c.id = $1""",
            conversation_id,
            MEMORY_ROLES,
        )
        if head is None or head["uncovered"] - window < lag:
            return None
        rows = await self._pool.fetch(
            """SELECT id, role, text FROM messages
                WHERE conversation_id = $1 AND generation = $2 AND role = ANY($3::text[])
                  AND id > $4
                ORDER BY id LIMIT $5""",
            conversation_id,
            head["generation"],
            MEMORY_ROLES,
            head["through_message"] or 0,
            head["uncovered"] - window,
        )
        return SummaryWork(
            conversation_id=conversation_id,
            generation=head["generation"],
            previous=head["summary"],
            through=head["through_message"],
            fallen_out=tuple(StoredMessage(r["id"], r["role"], r["text"]) for r in rows),
        )

    async def save_summary(
        self, conversation_id: int, generation: int, text: str, through: int
    ) -> bool:
        """Store a summary unless the conversation was cleared meanwhile or a newer one exists.

        The share lock makes a concurrent clear wait for this transaction (and then delete the
        row), or makes this one see the bumped generation: a late summary is never kept.
        """
        async with self._pool.acquire() as conn, conn.transaction():
            current = await conn.fetchval(
                "SELECT generation FROM conversations WHERE id = $1 FOR SHARE", conversation_id
            )
            if current != generation:
                return False
            written = await conn.fetchval(
                """INSERT INTO summaries (conversation_id, text, through_message, generation)
                   VALUES ($1, $2, $3, $4)
                   ON CONFLICT (conversation_id) DO UPDATE
                      SET text = EXCLUDED.text, through_message = EXCLUDED.through_message,
                          generation = EXCLUDED.generation, updated_at = now()
                    WHERE summaries.generation < EXCLUDED.generation
                       OR summaries.through_message < EXCLUDED.through_message
                   RETURNING 1""",
                conversation_id,
                text,
                through,
                generation,
            )
        return written is not None

    async def topic_work(self, conversation_id: int) -> TopicWork | None:
        """The first exchange, once one is stored and while the conversation has no topic.

        Every generation counts: the topic names the conversation, which a clear does not end.
        """
        row = await self._pool.fetchrow(
            """SELECT c.language, a.text AS answer,
                      (SELECT string_agg(v.text, E'\\n' ORDER BY v.id)
                         FROM (SELECT id, text FROM messages
                                WHERE conversation_id = c.id AND role = 'visitor' AND id < a.id
                                ORDER BY id LIMIT $2) v) AS question
                 FROM conversations c
                 JOIN LATERAL (
                       SELECT m.id, m.text FROM messages m
                        WHERE m.conversation_id = c.id AND m.role IN ('assistant', 'staff')
                          AND EXISTS (SELECT 1 FROM messages q
                                       WHERE q.conversation_id = c.id AND q.role = 'visitor'
                                         AND q.id < m.id)
                        ORDER BY m.id LIMIT 1) a ON true
                WHERE c.id = $1 AND c.topic IS NULL""",
            conversation_id,
            TOPIC_MESSAGES,
        )
        if row is None:
            return None
        return TopicWork(conversation_id, row["question"], row["answer"], row["language"])

    async def save_topic(self, conversation_id: int, topic: str) -> bool:
        """Store the topic unless the conversation has one already (another process named it
        first); False then, or when the conversation is gone."""
        written = await self._pool.fetchval(
            """UPDATE conversations SET topic = $2
                WHERE id = $1 AND topic IS NULL
            RETURNING 1""",
            conversation_id,
            topic,
        )
        return written is not None

    async def clear(self, agent_id: int, channel: str, key: str) -> tuple[int, int] | None:
        """Start a new generation and drop the summary; (conversation id, new generation).

        The messages stay, for staff; memory reads only the current generation's.
        """
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                """UPDATE conversations SET generation = generation + 1
                    WHERE agent_id = $1 AND channel = $2 AND conversation_key = $3
                RETURNING id, generation""",
                agent_id,
                channel,
                key,
            )
            if row is None:
                return None
            await conn.execute("DELETE FROM summaries WHERE conversation_id = $1", row["id"])
        return row["id"], row["generation"]

    async def behind(
        self, window: int, lag: int, *, limit: int, active_since: datetime | None = None
    ) -> list[int]:
        """Conversations whose summary is due by the rule of `summary_work`, quietest first."""
        rows = await self._pool.fetch(
            """SELECT c.id FROM conversations c
                 LEFT JOIN summaries s
                        ON s.conversation_id = c.id AND s.generation = c.generation
                WHERE ($4::timestamptz IS NULL OR c.last_message_at >= $4)
                  AND (SELECT count(*) FROM messages m
                        WHERE m.conversation_id = c.id AND m.generation = c.generation
                          AND m.role = ANY($1::text[])
                          AND m.id > COALESCE(s.through_message, 0)) >= $2
                ORDER BY c.last_message_at
                LIMIT $3""",
            MEMORY_ROLES,
            window + lag,
            limit,
            active_since,
        )
        return [r["id"] for r in rows]
