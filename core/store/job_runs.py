"""Scheduled-job runs: the advisory lock each job runs under, and the record of every run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import asyncpg

from core.store.database import Connection

# First key of every job's two-key advisory lock; keeps job locks apart from other locks.
_LOCK_SPACE = 0x4A4F4253  # "JOBS"
INTERRUPTED = "interrupted: the process running it stopped before it finished"

Trigger = Literal["schedule", "manual"]


@dataclass(frozen=True, slots=True)
class JobRun:
    id: int
    name: str
    trigger: str
    slot: datetime | None
    instance: str
    status: str  # running, ok, failed
    started_at: datetime
    finished_at: datetime | None
    summary: str | None
    details: Mapping[str, Any]
    error: str | None


_COLUMNS = ", ".join(JobRun.__dataclass_fields__)


async def try_lock(conn: Connection, name: str) -> bool:
    """Take the job's lock for as long as ``conn`` stays open; False if another holds it."""
    locked: bool = await conn.fetchval(
        "SELECT pg_try_advisory_lock($1, hashtext($2))", _LOCK_SPACE, name
    )
    return locked


class JobRuns:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def close_interrupted(self, name: str) -> int:
        """Fail the job's runs still marked running. Only the lock holder may call this: a run
        is only ever started under the lock, so any other running row belongs to a process
        that died holding it."""
        result = await self._pool.execute(
            """UPDATE job_runs SET status = 'failed', finished_at = now(), error = $2
                WHERE name = $1 AND status = 'running'""",
            name,
            INTERRUPTED,
        )
        return int(result.split()[-1])

    async def start(
        self, name: str, *, trigger: Trigger, slot: datetime | None, instance: str
    ) -> JobRun | None:
        """Record a run as started; None when this slot of the job has a run already."""
        row = await self._pool.fetchrow(
            f"""INSERT INTO job_runs (name, trigger, slot, instance) VALUES ($1, $2, $3, $4)
                ON CONFLICT (name, slot) WHERE slot IS NOT NULL DO NOTHING
                RETURNING {_COLUMNS}""",
            name,
            trigger,
            slot,
            instance,
        )
        return JobRun(**dict(row)) if row is not None else None

    async def finish(self, run_id: int, summary: str, details: Mapping[str, Any]) -> JobRun:
        row = await self._pool.fetchrow(
            f"""UPDATE job_runs SET status = 'ok', finished_at = now(), summary = $2,
                                    details = $3
                 WHERE id = $1 RETURNING {_COLUMNS}""",
            run_id,
            summary,
            dict(details),
        )
        assert row is not None  # the row was inserted by this run
        return JobRun(**dict(row))

    async def fail(self, run_id: int, error: str) -> JobRun:
        row = await self._pool.fetchrow(
            f"""UPDATE job_runs SET status = 'failed', finished_at = now(), error = $2
                 WHERE id = $1 RETURNING {_COLUMNS}""",
            run_id,
            error,
        )
        assert row is not None
        return JobRun(**dict(row))

    async def running(self, name: str) -> JobRun | None:
        """The job's run in progress, if the record shows one."""
        row = await self._pool.fetchrow(
            f"""SELECT {_COLUMNS} FROM job_runs WHERE name = $1 AND status = 'running'
                 ORDER BY id DESC LIMIT 1""",
            name,
        )
        return JobRun(**dict(row)) if row is not None else None

    async def latest(self) -> dict[str, JobRun]:
        """The most recent run of each job that has run."""
        rows = await self._pool.fetch(
            f"SELECT DISTINCT ON (name) {_COLUMNS} FROM job_runs ORDER BY name, id DESC"
        )
        return {r["name"]: JobRun(**dict(r)) for r in rows}

    async def recent(self, name: str | None = None, limit: int = 50) -> list[JobRun]:
        """Runs newest first, of one job or of all."""
        rows = await self._pool.fetch(
            f"""SELECT {_COLUMNS} FROM job_runs WHERE $1::text IS NULL OR name = $1
                 ORDER BY id DESC LIMIT $2""",
            name,
            limit,
        )
        return [JobRun(**dict(r)) for r in rows]
