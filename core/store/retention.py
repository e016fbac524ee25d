"""Deleting what is older than the retention period: conversations, finished queue rows, runs."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

# Rows deleted per statement, so a first purge of a large backlog never holds long locks.
BATCH = 1000


@dataclass(frozen=True, slots=True)
class Purged:
    conversations: int = 0
    inbox: int = 0
    outbox: int = 0
    job_runs: int = 0


def _count(status: str) -> int:
    return int(status.split()[-1])


class Retention:
    def __init__(self, pool: asyncpg.Pool, *, batch: int = BATCH) -> None:
        self._pool = pool
        self._batch = batch

    async def purge(self, days: int) -> Purged:
        """Delete what is older than ``days`` days.

        A conversation goes (with its messages, turns, summary and queued replies, by
        cascade) when its last message is; inbox and outbox rows only once they are finished;
        job runs except each job's latest, which `parley jobs list` shows.
        """
        return Purged(
            conversations=await self._until_done(
                """DELETE FROM conversations WHERE id IN (
                       SELECT c.id FROM conversations c
                        WHERE c.last_message_at < now() - make_interval(days => $1)
                          AND NOT EXISTS (
                              SELECT 1 FROM messages m
                               WHERE m.conversation_id = c.id
                                 AND m.created_at >= now() - make_interval(days => $1))
                        LIMIT $2)""",
                days,
            ),
            inbox=await self._until_done(
                """DELETE FROM inbox WHERE id IN (
                       SELECT id FROM inbox
                        WHERE status IN ('done', 'ignored', 'failed')
                          AND coalesce(processed_at, received_at)
                              < now() - make_interval(days => $1)
                        LIMIT $2)""",
                days,
            ),
            outbox=await self._until_done(
                """DELETE FROM outbox WHERE id IN (
                       SELECT id FROM outbox
                        WHERE status IN ('sent', 'delivered', 'read', 'failed', 'undelivered')
                          AND coalesce(sent_at, created_at) < now() - make_interval(days => $1)
                        LIMIT $2)""",
                days,
            ),
            job_runs=await self._until_done(
                """DELETE FROM job_runs WHERE id IN (
                       SELECT id FROM job_runs
                        WHERE started_at < now() - make_interval(days => $1)
                          AND status <> 'running'
                          AND id NOT IN (SELECT max(id) FROM job_runs GROUP BY name)
                        LIMIT $2)""",
                days,
            ),
        )

    async def _until_done(self, statement: str, days: int) -> int:
        total = 0
        while True:
            deleted = _count(await self._pool.execute(statement, days, self._batch))
            total += deleted
            if deleted < self._batch:
                return total
