"""Conversations, their messages and turn traces, usage and content gaps: what a turn leaves."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from typing import Any

import asyncpg

# A customer's name or handle as kept: providers send short ones; a longer one is cut.
_MAX_NAME_CHARS = 200


@dataclass(frozen=True, slots=True)
class StoredMessage:
    id: int
    role: str
    text: str


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """Everything one answered turn writes, in one transaction, after the stream."""

    agent_id: int
    channel: str
    conversation_key: str
    question: str
    answer: str
    save_question: bool
    rewritten_query: str | None
    confidence: float | None
    low_confidence: bool
    mode: str
    trace: Mapping[str, Any]
    language: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    count_usage: bool = True
    gap_reason: str | None = None  # "weak_match" or "deferred"


@dataclass(frozen=True, slots=True)
class SavedTurn:
    conversation_id: int
    turn_id: int
    generation: int = 0
    messages: tuple[StoredMessage, ...] = ()  # what the turn added, for conversation memory


class Conversations:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def find(self, agent_id: int, channel: str, key: str) -> int | None:
        found: int | None = await self._pool.fetchval(
            """SELECT id FROM conversations
                WHERE agent_id = $1 AND channel = $2 AND conversation_key = $3""",
            agent_id,
            channel,
            key,
        )
        return found

    async def remember_customer(
        self,
        agent_id: int,
        channel: str,
        conversation_key: str,
        name: str | None = None,
        handle: str | None = None,
    ) -> int:
        """The conversation's id, the row made when there is none yet, with the customer's
        name and handle (as the channel gave them) kept for staff to see. A name or handle
        not given (None or blank) leaves the known one as it is: a message without a profile
        name never blanks it."""
        name, handle = _given(name), _given(handle)
        # Written only when something changes: every message of a chat passes here.
        found: int | None = await self._pool.fetchval(
            """INSERT INTO conversations (agent_id, channel, conversation_key, customer_name,
                                          customer_handle)
               VALUES ($1, $2, $3, $4, $5)
               ON CONFLICT (agent_id, channel, conversation_key) DO UPDATE
                  SET customer_name = COALESCE(EXCLUDED.customer_name, conversations.customer_name),
                      customer_handle = COALESCE(EXCLUDED.customer_handle,
                                                 conversations.customer_handle)
                WHERE conversations.customer_name IS DISTINCT FROM
                          COALESCE(EXCLUDED.customer_name, conversations.customer_name)
                   OR conversations.customer_handle IS DISTINCT FROM
                          COALESCE(EXCLUDED.customer_handle, conversations.customer_handle)
               RETURNING id""",
            agent_id,
            channel,
            conversation_key,
            name,
            handle,
        )
        if found is None:  # there, and already as given
            found = await self.find(agent_id, channel, conversation_key)
        if found is None:  # erased in between: made again
            return await self.remember_customer(agent_id, channel, conversation_key, name, handle)
        return found

    async def language(self, agent_id: int, channel: str, key: str) -> str | None:
        """The language the conversation has been held in so far, if any."""
        found: str | None = await self._pool.fetchval(
            """SELECT language FROM conversations
                WHERE agent_id = $1 AND channel = $2 AND conversation_key = $3""",
            agent_id,
            channel,
            key,
        )
        return found

    async def recent(self, conversation_id: int, limit: int = 12) -> list[StoredMessage]:
        """The last messages of the current generation, oldest first."""
        rows = await self._pool.fetch(
            """SELECT m.id, m.role, m.text FROM messages m
                 JOIN conversations c ON c.id = m.conversation_id
                WHERE m.conversation_id = $1 AND m.generation = c.generation
                  AND m.role IN ('visitor', 'assistant', 'staff')
                ORDER BY m.id DESC LIMIT $2""",
            conversation_id,
            limit,
        )
        return [StoredMessage(r["id"], r["role"], r["text"]) for r in reversed(rows)]

    async def save_turn(self, record: TurnRecord) -> SavedTurn:
        async with self._pool.acquire() as conn, conn.transaction():
            conversation_id: int = await conn.fetchval(
                """INSERT INTO conversations (agent_id, channel, conversation_key, language)
                   VALUES ($1, $2, $3, $4)
                   ON CONFLICT (agent_id, channel, conversation_key) DO UPDATE
                      SET last_message_at = now(),
                          language = COALESCE(EXCLUDED.language, conversations.language)
                   RETURNING id""",
                record.agent_id,
                record.channel,
                record.conversation_key,
                record.language,
            )
            turn_id: int = await conn.fetchval(
                """INSERT INTO turns (conversation_id, agent_id, channel, query, rewritten_query,
                                      confidence, low_confidence, mode, trace)
                   VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id""",
                conversation_id,
                record.agent_id,
                record.channel,
                record.question,
                record.rewritten_query,
                record.confidence,
                record.low_confidence,
                record.mode,
                dict(record.trace),
            )
            generation = await conn.fetchval(
                "SELECT generation FROM conversations WHERE id = $1", conversation_id
            )
            added: list[StoredMessage] = []
            if record.save_question:
                # The visitor's message belongs to the turn too: a superseded turn goes whole.
                question_id = await _add_message(
                    conn, conversation_id, "visitor", record.question, turn_id, generation
                )
                added.append(StoredMessage(question_id, "visitor", record.question))
            answer_id = await _add_message(
                conn, conversation_id, "assistant", record.answer, turn_id, generation
            )
            added.append(StoredMessage(answer_id, "assistant", record.answer))
            if record.count_usage:
                await conn.execute(
                    """INSERT INTO usage (agent_id, day, channel, turns, prompt_tokens,
                                          completion_tokens)
                       VALUES ($1, $2, $3, 1, $4, $5)
                       ON CONFLICT (agent_id, day, channel) DO UPDATE SET
                           turns = usage.turns + 1,
                           prompt_tokens = usage.prompt_tokens + EXCLUDED.prompt_tokens,
                           completion_tokens = usage.completion_tokens
                                               + EXCLUDED.completion_tokens""",
                    record.agent_id,
                    date.today(),
                    record.channel,
                    record.prompt_tokens,
                    record.completion_tokens,
                )
            if record.gap_reason is not None:
                await conn.execute(
                    """INSERT INTO content_gaps (agent_id, turn_id, question, language, reason,
                                                 confidence)
                       VALUES ($1, $2, $3, $4, $5, $6)""",
                    record.agent_id,
                    turn_id,
                    # the self-contained question: "and how much is it?" names no product
                    record.rewritten_query or record.question,
                    record.language,
                    record.gap_reason,
                    record.confidence,
                )
        return SavedTurn(conversation_id, turn_id, generation, tuple(added))


def _given(value: str | None) -> str | None:
    """A name as stored: without control characters (PostgreSQL stores no NUL) or outer
    spaces, and None when nothing is left."""
    if value is None:
        return None
    cleaned = "".join(ch for ch in value if ch >= " " and ch != "\x7f").strip()
    return cleaned[:_MAX_NAME_CHARS] or None


async def discard_turn(conn: Any, turn_id: int) -> None:
    """Forget a turn whose reply was never sent (a newer message superseded it)."""
    await conn.execute("DELETE FROM messages WHERE turn_id = $1", turn_id)
    await conn.execute("DELETE FROM turns WHERE id = $1", turn_id)


async def reply_message_id(conn: Any, turn_id: int) -> int | None:
    """The stored answer of a turn (what an outbox row delivers)."""
    found: int | None = await conn.fetchval(
        """SELECT id FROM messages WHERE turn_id = $1 AND role = 'assistant'
            ORDER BY id DESC LIMIT 1""",
        turn_id,
    )
    return found


async def _add_message(
    conn: Any, conversation_id: int, role: str, text: str, turn_id: int | None, generation: int
) -> int:
    message_id: int = await conn.fetchval(
        """INSERT INTO messages (conversation_id, role, text, turn_id, generation)
           VALUES ($1, $2, $3, $4, $5) RETURNING id""",
        conversation_id,
        role,
        text,
        turn_id,
        generation,
    )
    return message_id
