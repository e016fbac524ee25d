"""Curated answers: canned replies staff wrote for questions that must be answered exactly."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg


@dataclass(frozen=True, slots=True)
class CuratedAnswer:
    id: int
    question: str
    keywords: tuple[str, ...]
    pattern: str | None
    answer: str
    language: str | None


class CuratedAnswers:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def create(
        self,
        agent_id: int,
        answer: str,
        *,
        question: str = "",
        keywords: tuple[str, ...] = (),
        pattern: str | None = None,
        language: str | None = None,
    ) -> int:
        new_id: int = await self._pool.fetchval(
            """INSERT INTO curated_answers (agent_id, question, keywords, pattern, answer, language)
               VALUES ($1, $2, $3, $4, $5, $6) RETURNING id""",
            agent_id,
            question,
            list(keywords),
            pattern,
            answer,
            language,
        )
        return new_id

    async def enabled(self, agent_id: int) -> list[CuratedAnswer]:
        rows = await self._pool.fetch(
            """SELECT id, question, keywords, pattern, answer, language FROM curated_answers
                WHERE agent_id = $1 AND enabled ORDER BY id""",
            agent_id,
        )
        return [
            CuratedAnswer(
                r["id"],
                r["question"],
                tuple(r["keywords"]),
                r["pattern"],
                r["answer"],
                r["language"],
            )
            for r in rows
        ]

    async def count_hit(self, curated_id: int) -> None:
        await self._pool.execute(
            "UPDATE curated_answers SET hit_count = hit_count + 1 WHERE id = $1", curated_id
        )
