"""Answer checks: staff's test questions per agent, and the result of each nightly run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from core.errors import InvalidInput, NotFound


@dataclass(frozen=True, slots=True)
class AnswerCheck:
    id: int
    agent_id: int
    question: str
    expected_facts: tuple[str, ...]  # each must appear in the answer, case-insensitive
    must_cite: str | None  # a page URL the answer must cite
    language: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class CheckResult:
    id: int
    run_id: int
    check_id: int
    agent_id: int
    question: str
    passed: bool
    answer: str
    missing_facts: tuple[str, ...]
    cited_urls: tuple[str, ...]
    cited_ok: bool | None  # None when the check names no URL
    confidence: float | None
    error: str | None
    turn_id: int | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class NewResult:
    """What one check's run found, before it is stored."""

    check_id: int
    agent_id: int
    passed: bool
    answer: str
    missing_facts: tuple[str, ...] = ()
    cited_urls: tuple[str, ...] = ()
    cited_ok: bool | None = None
    confidence: float | None = None
    error: str | None = None
    turn_id: int | None = None


_CHECK_COLUMNS = ", ".join(AnswerCheck.__dataclass_fields__)
_RESULT_COLUMNS = ", ".join(
    "c.question" if f == "question" else f"r.{f}" for f in CheckResult.__dataclass_fields__
)


def _check(row: asyncpg.Record) -> AnswerCheck:
    values = dict(row)
    values["expected_facts"] = tuple(values["expected_facts"])
    return AnswerCheck(**values)


def _result(row: asyncpg.Record) -> CheckResult:
    values = dict(row)
    values["missing_facts"] = tuple(values["missing_facts"])
    values["cited_urls"] = tuple(values["cited_urls"])
    return CheckResult(**values)


class AnswerChecks:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def create(
        self,
        agent_id: int,
        question: str,
        *,
        expected_facts: Sequence[str] = (),
        must_cite: str | None = None,
        language: str | None = None,
    ) -> AnswerCheck:
        """A new check; it needs a question and at least one fact or a URL to cite."""
        question = question.strip()
        facts = [f.strip() for f in expected_facts if f.strip()]
        cite = must_cite.strip() if must_cite and must_cite.strip() else None
        if not question:
            raise InvalidInput("an answer check needs a question")
        if not facts and cite is None:
            raise InvalidInput("an answer check needs an expected fact or a URL to cite")
        row = await self._pool.fetchrow(
            f"""INSERT INTO answer_checks (agent_id, question, expected_facts, must_cite, language)
                VALUES ($1, $2, $3, $4, $5) RETURNING {_CHECK_COLUMNS}""",
            agent_id,
            question,
            facts,
            cite,
            language,
        )
        assert row is not None
        return _check(row)

    async def delete(self, agent_id: int, check_id: int) -> None:
        """Remove a check and its results."""
        deleted = await self._pool.execute(
            "DELETE FROM answer_checks WHERE id = $1 AND agent_id = $2", check_id, agent_id
        )
        if deleted == "DELETE 0":
            raise NotFound(f"no answer check {check_id} for this agent")

    async def agents_with_checks(self) -> list[int]:
        rows = await self._pool.fetch("SELECT DISTINCT agent_id FROM answer_checks ORDER BY 1")
        return [r["agent_id"] for r in rows]

    async def record(self, run_id: int, result: NewResult) -> None:
        await self._pool.execute(
            """INSERT INTO answer_check_results (run_id, check_id, agent_id, passed, answer,
                   missing_facts, cited_urls, cited_ok, confidence, error, turn_id)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)""",
            run_id,
            result.check_id,
            result.agent_id,
            result.passed,
            result.answer,
            list(result.missing_facts),
            list(result.cited_urls),
            result.cited_ok,
            result.confidence,
            result.error,
            result.turn_id,
        )

    async def results(
        self, agent_id: int, *, run_id: int | None = None, limit: int = 200
    ) -> list[CheckResult]:
        """An agent's results newest first, of one run or of all recent runs."""
        rows = await self._pool.fetch(
            f"""SELECT {_RESULT_COLUMNS} FROM answer_check_results r
                  JOIN answer_checks c ON c.id = r.check_id
                 WHERE r.agent_id = $1 AND ($2::bigint IS NULL OR r.run_id = $2)
                 ORDER BY r.id DESC LIMIT $3""",
            agent_id,
            run_id,
            limit,
        )
        return [_result(r) for r in rows]

    async def latest_results(self, agent_id: int) -> list[CheckResult]:
        """The most recent result of each of the agent's checks, in the checks' order."""
        rows = await self._pool.fetch(
            f"""SELECT DISTINCT ON (r.check_id) {_RESULT_COLUMNS} FROM answer_check_results r
                  JOIN answer_checks c ON c.id = r.check_id
                 WHERE r.agent_id = $1
                 ORDER BY r.check_id, r.id DESC""",
            agent_id,
        )
        return [_result(r) for r in rows]

    # Last in the class: defined earlier, the name would shadow `list` in the annotations.
    async def list(self, agent_id: int) -> list[AnswerCheck]:
        """An agent's checks, oldest first."""
        rows = await self._pool.fetch(
            f"SELECT {_CHECK_COLUMNS} FROM answer_checks WHERE agent_id = $1 ORDER BY id",
            agent_id,
        )
        return [_check(r) for r in rows]
