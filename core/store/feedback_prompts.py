"""Feedback prompts in Postgres: the answer a messaging customer was last asked to rate, and
whether their next message may still be that rating."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import asyncpg

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

AnswerBy = Literal["text", "buttons"]
Connection: TypeAlias = "asyncpg.Connection[Any] | PoolConnectionProxy[Any]"

# Turns that are the bot's answers: not staff's, not a request for a person, not a fixed
# sentence (welcome, "please type", "thanks for your feedback").
ANSWER_MODES = ("llm", "explore", "extractive", "curated")


@dataclass(frozen=True, slots=True)
class FeedbackPrompt:
    """An open prompt: the conversation's customer was asked to rate ``turn_id`` and has not
    written since. ``fresh`` while their reply may still be read as the rating."""

    conversation_id: int
    turn_id: int
    answer_by: AnswerBy
    asked_at: datetime
    fresh: bool


async def last_answer(conn: Connection, conversation_id: int) -> int | None:
    """The bot's latest answer in the conversation (a turn id), if it gave one."""
    found: int | None = await conn.fetchval(
        """SELECT id FROM turns WHERE conversation_id = $1 AND mode = ANY($2::text[])
            ORDER BY id DESC LIMIT 1""",
        conversation_id,
        list(ANSWER_MODES),
    )
    return found


async def ask(conn: Connection, conversation_id: int, turn_id: int, answer_by: AnswerBy) -> bool:
    """Record that the customer is asked to rate ``turn_id`` now (replacing the conversation's
    earlier prompt); False, with nothing changed, when they were asked about it already."""
    asked = await conn.fetchval(
        """INSERT INTO feedback_prompts (conversation_id, turn_id, answer_by)
           VALUES ($1, $2, $3)
           ON CONFLICT (conversation_id) DO UPDATE
              SET turn_id = EXCLUDED.turn_id, answer_by = EXCLUDED.answer_by,
                  asked_at = now(), closed_at = NULL
            WHERE feedback_prompts.turn_id <> EXCLUDED.turn_id
           RETURNING true""",
        conversation_id,
        turn_id,
        answer_by,
    )
    return bool(asked)


async def close(conn: Connection, prompt: FeedbackPrompt) -> None:
    """The customer wrote after ``prompt``: their later messages are no rating of it. A newer
    prompt of the conversation (asked meanwhile) stays open."""
    await conn.execute(
        """UPDATE feedback_prompts SET closed_at = now()
            WHERE conversation_id = $1 AND turn_id = $2 AND asked_at = $3
              AND closed_at IS NULL""",
        prompt.conversation_id,
        prompt.turn_id,
        prompt.asked_at,
    )


class FeedbackPromptStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def open(
        self, agent_id: int, channel: str, key: str, *, fresh_hours: float
    ) -> FeedbackPrompt | None:
        """The conversation's open prompt, ``fresh`` when asked less than ``fresh_hours`` ago."""
        row = await self._pool.fetchrow(
            """SELECT p.conversation_id, p.turn_id, p.answer_by, p.asked_at,
                      p.asked_at > now() - make_interval(secs => $4) AS fresh
                 FROM feedback_prompts p JOIN conversations c ON c.id = p.conversation_id
                WHERE c.agent_id = $1 AND c.channel = $2 AND c.conversation_key = $3
                  AND p.closed_at IS NULL""",
            agent_id,
            channel,
            key,
            fresh_hours * 3600,
        )
        return FeedbackPrompt(**dict(row)) if row is not None else None
