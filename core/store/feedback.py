"""Visitors' ratings of answers: one per turn, a thumbs-down also opened as a content gap."""

from __future__ import annotations

from typing import Literal

import asyncpg

MAX_COMMENT_CHARS = 1000
Rating = Literal["up", "down"]


class Feedback:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def record(
        self,
        agent_id: int,
        channel: str,
        conversation_key: str,
        turn_id: int,
        rating: Rating,
        comment: str | None = None,
    ) -> bool:
        """Rate ``turn_id``, replacing an earlier rating of it; False (nothing stored) unless
        the turn belongs to that conversation, so nobody rates, or learns of, another's turn.

        "down" opens a content gap (reason ``thumbs_down``) unless one is open for the turn;
        "up" withdraws an open one: the visitor changed their mind.
        """
        comment = (comment or "").strip()[:MAX_COMMENT_CHARS] or None
        async with self._pool.acquire() as conn, conn.transaction():
            turn = await conn.fetchrow(
                """SELECT t.id, t.conversation_id, coalesce(t.rewritten_query, t.query) AS question,
                          t.confidence, c.language
                     FROM turns t JOIN conversations c ON c.id = t.conversation_id
                    WHERE t.id = $1 AND c.agent_id = $2 AND c.channel = $3
                      AND c.conversation_key = $4 AND t.mode <> 'staff'""",
                turn_id,
                agent_id,
                channel,
                conversation_key,
            )
            if turn is None:
                return False
            await conn.execute(
                """INSERT INTO feedback (agent_id, conversation_id, turn_id, channel, rating,
                                         comment)
                   VALUES ($1, $2, $3, $4, $5, $6)
                   ON CONFLICT (turn_id) DO UPDATE
                      SET rating = EXCLUDED.rating, comment = EXCLUDED.comment,
                          created_at = now()""",
                agent_id,
                turn["conversation_id"],
                turn_id,
                channel,
                rating,
                comment,
            )
            if rating == "down":
                await conn.execute(
                    """INSERT INTO content_gaps (agent_id, turn_id, question, language, reason,
                                                 confidence)
                       VALUES ($1, $2, $3, $4, 'thumbs_down', $5)
                       ON CONFLICT (turn_id)
                          WHERE reason = 'thumbs_down' AND resolved_at IS NULL DO NOTHING""",
                    agent_id,
                    turn_id,
                    turn["question"],
                    turn["language"],
                    turn["confidence"],
                )
            else:
                await conn.execute(
                    """DELETE FROM content_gaps WHERE turn_id = $1 AND reason = 'thumbs_down'
                          AND resolved_at IS NULL""",
                    turn_id,
                )
        return True
