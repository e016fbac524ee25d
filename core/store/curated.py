"""Curated answers: canned replies staff wrote for questions that must be answered exactly."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from core.errors import InvalidInput, NotFound
from core.patterns import compile_pattern


@dataclass(frozen=True, slots=True)
class CuratedAnswer:
    id: int
    question: str
    keywords: tuple[str, ...]
    pattern: str | None
    answer: str
    language: str | None


@dataclass(frozen=True, slots=True)
class CuratedEntry:
    """A curated answer as staff manage it: its triggers, whether it is on, how often used."""

    id: int
    agent_id: int
    question: str
    keywords: tuple[str, ...]
    pattern: str | None
    answer: str
    language: str | None
    enabled: bool
    hit_count: int
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> CuratedEntry:
        return cls(**{**dict(row), "keywords": tuple(row["keywords"])})


_ENTRY = ", ".join(CuratedEntry.__dataclass_fields__)
_EDITABLE = frozenset({"question", "keywords", "pattern", "answer", "language", "enabled"})


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
        if pattern:
            compile_pattern(pattern)  # InvalidInput when RE2 cannot match it
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

    async def list(self, agent_id: int) -> list[CuratedEntry]:
        rows = await self._pool.fetch(
            f"SELECT {_ENTRY} FROM curated_answers WHERE agent_id = $1 ORDER BY id", agent_id
        )
        return [CuratedEntry.from_row(r) for r in rows]

    async def get(self, agent_id: int, curated_id: int) -> CuratedEntry:
        row = await self._pool.fetchrow(
            f"SELECT {_ENTRY} FROM curated_answers WHERE agent_id = $1 AND id = $2",
            agent_id,
            curated_id,
        )
        if row is None:
            raise NotFound(f"no curated answer {curated_id} for this agent")
        return CuratedEntry.from_row(row)

    async def update(self, agent_id: int, curated_id: int, **changes: Any) -> CuratedEntry:
        unknown = set(changes) - _EDITABLE
        if unknown:
            raise InvalidInput(f"unknown curated answer field(s): {', '.join(sorted(unknown))}")
        if "keywords" in changes:
            changes["keywords"] = list(changes["keywords"])
        if changes.get("pattern"):
            compile_pattern(changes["pattern"])
        if changes:
            names = sorted(changes)
            assignments = ", ".join(f"{name} = ${i}" for i, name in enumerate(names, start=3))
            done = await self._pool.execute(
                f"""UPDATE curated_answers SET {assignments}, updated_at = now()
                     WHERE agent_id = $1 AND id = $2""",
                agent_id,
                curated_id,
                *(changes[n] for n in names),
            )
            if done == "UPDATE 0":
                raise NotFound(f"no curated answer {curated_id} for this agent")
        return await self.get(agent_id, curated_id)

    async def delete(self, agent_id: int, curated_id: int) -> None:
        done = await self._pool.execute(
            "DELETE FROM curated_answers WHERE agent_id = $1 AND id = $2", agent_id, curated_id
        )
        if done == "DELETE 0":
            raise NotFound(f"no curated answer {curated_id} for this agent")
