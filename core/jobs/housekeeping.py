"""The housekeeping jobs: the retention purge and the outbox sweep."""

from __future__ import annotations

from dataclasses import asdict

from core.jobs.scheduler import JobResult
from core.store.outbox import Outbox
from core.store.retention import Retention

# Reply parts still unsent this long after they were queued are given up on.
OUTBOX_GIVE_UP_SECONDS = 24 * 3600.0


async def purge_old(retention: Retention, days: int) -> JobResult:
    """Delete conversations and finished queue rows older than ``days`` (0: keep everything)."""
    if days == 0:
        return JobResult("retention is off (PARLEY_RETENTION_DAYS=0): nothing deleted", {"days": 0})
    purged = await retention.purge(days)
    return JobResult(
        f"older than {days} days: {purged.conversations} conversations, {purged.inbox} inbox "
        f"rows, {purged.outbox} outbox rows and {purged.job_runs} job runs deleted",
        {"days": days, **asdict(purged)},
    )


async def sweep_outbox(
    outbox: Outbox, *, give_up_after: float = OUTBOX_GIVE_UP_SECONDS
) -> JobResult:
    """Give up on replies that waited too long, then put those a dead sender left behind
    back in the queue; retries and backoff stay the sender's business."""
    expired = await outbox.expire_unsent(give_up_after)
    released = await outbox.release_expired_leases()
    return JobResult(
        f"{released} stuck sends put back in the queue, {expired} unsent replies given up",
        {"released": released, "expired": expired},
    )
