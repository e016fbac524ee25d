"""Scheduled jobs: when each runs, and running each scheduled slot once across all processes.

Every process (`parley serve`, any number of `parley worker`) runs the same schedule. A job
runs under a Postgres advisory lock, so two runs of one job never overlap, and each run is
recorded in ``job_runs`` with the slot (the scheduled time) it is for; a slot recorded once is
not run again, so processes whose timers fire a few seconds apart run it once between them.
Interval schedules count from the Unix epoch, which gives every process the same slots.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from typing import Any, Literal
from zoneinfo import ZoneInfo

import asyncpg
import tzlocal
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from core.errors import ConfigError
from core.settings import JOB_NAMES, Settings
from core.store.job_runs import JobRun, JobRuns, Trigger, try_lock

log = logging.getLogger(__name__)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_UNITS = {"s": 1, "m": 60, "h": 3600}
_EVERY = re.compile(r"^every\s+([1-9]\d*)\s*([smh])$")
_DAILY = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")
DEFAULT_EVERY = {"summaries": 300, "outbox-sweep": 300}
# Minutes after PARLEY_NIGHTLY_AT: the answer checks should see the fresh crawl.
NIGHTLY_OFFSETS = {"recrawl": 0, "retention": 30, "answer-checks": 60}


@dataclass(frozen=True, slots=True)
class Every:
    """Every ``seconds``, at multiples of it since the epoch (every 5m: :00, :05, ...)."""

    seconds: int

    def slot(self, now: datetime) -> datetime:
        elapsed = int((now - _EPOCH).total_seconds())
        return _EPOCH + timedelta(seconds=elapsed - elapsed % self.seconds)

    def next_after(self, now: datetime) -> datetime:
        return self.slot(now) + timedelta(seconds=self.seconds)

    def trigger(self) -> Any:
        return IntervalTrigger(seconds=self.seconds, start_date=_EPOCH, timezone=UTC)

    @property
    def grace(self) -> int:
        # A firing delayed by less than the interval still belongs to its own slot.
        return self.seconds

    def describe(self) -> str:
        for unit, size in (("h", 3600), ("m", 60)):
            if self.seconds % size == 0:
                return f"every {self.seconds // size}{unit}"
        return f"every {self.seconds}s"


@dataclass(frozen=True, slots=True)
class DailyAt:
    """Once a day at ``at`` in ``zone``."""

    at: time
    zone: tzinfo

    def slot(self, now: datetime) -> datetime:
        local = now.astimezone(self.zone)
        today = datetime.combine(local.date(), self.at, tzinfo=self.zone)
        return today if today <= local else today - timedelta(days=1)

    def next_after(self, now: datetime) -> datetime:
        local = now.astimezone(self.zone)
        today = datetime.combine(local.date(), self.at, tzinfo=self.zone)
        return today if today > local else today + timedelta(days=1)

    def later(self, minutes: int) -> DailyAt:
        moved = datetime.combine(date(2000, 1, 1), self.at) + timedelta(minutes=minutes)
        return DailyAt(moved.time(), self.zone)

    def trigger(self) -> Any:
        return CronTrigger(hour=self.at.hour, minute=self.at.minute, timezone=self.zone)

    @property
    def grace(self) -> int:
        return 3600

    def describe(self) -> str:
        return f"daily {self.at:%H:%M} {self.zone}"


Schedule = Every | DailyAt


def parse_schedule(text: str, zone: tzinfo) -> Schedule | None:
    """``every 30s`` / ``every 5m`` / ``every 2h``, ``HH:MM`` (daily), or ``off`` (None)."""
    value = text.strip().lower()
    if value == "off":
        return None
    every = _EVERY.match(value)
    if every:
        return Every(int(every[1]) * _UNITS[every[2]])
    daily = _DAILY.match(value)
    if daily:
        return DailyAt(time(int(daily[1]), int(daily[2])), zone)
    raise ConfigError(f"schedule {text!r}: expected 'every 5m', 'HH:MM' or 'off'")


def jobs_zone(settings: Settings) -> tzinfo:
    """PARLEY_JOBS_TIMEZONE, else the server's own time zone: agent-independent."""
    if settings.jobs_timezone:
        return ZoneInfo(settings.jobs_timezone)
    return tzlocal.get_localzone()


def job_schedules(settings: Settings) -> dict[str, Schedule | None]:
    """Each job's schedule, in the order operators see them; None: only run by hand."""
    zone = jobs_zone(settings)
    nightly = parse_schedule(settings.nightly_at, zone)
    assert isinstance(nightly, DailyAt)  # the setting only admits HH:MM
    schedules: dict[str, Schedule | None] = {}
    for name in JOB_NAMES:
        override = settings.job_schedules.get(name)
        if override is not None:
            schedules[name] = parse_schedule(override, zone)
        elif name in DEFAULT_EVERY:
            schedules[name] = Every(DEFAULT_EVERY[name])
        else:
            schedules[name] = nightly.later(NIGHTLY_OFFSETS[name])
    return schedules


@dataclass(frozen=True, slots=True)
class JobResult:
    summary: str  # one line for operators
    details: Mapping[str, Any] = field(default_factory=dict)  # counts, kept with the run


@dataclass(frozen=True, slots=True)
class Job:
    name: str
    schedule: Schedule | None
    run: Callable[[JobRun], Awaitable[JobResult]]  # given its run, e.g. to file results under


@dataclass(frozen=True, slots=True)
class Skipped:
    """A run that did not happen: ``busy`` (another run holds the lock) or ``done`` (this
    slot ran already)."""

    reason: Literal["busy", "done"]
    holder: JobRun | None = None  # the run in progress, when busy


def instance_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class JobRunner:
    """Runs a job under its advisory lock and records the run.

    The lock lives on a connection of its own, outside the pool, held for the whole run: the
    job's own queries use the pool, and a process that dies drops the connection and with it
    the lock.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        *,
        instance: str | None = None,
    ) -> None:
        self._runs = JobRuns(pool)
        self._connect = connect
        self.instance = instance or instance_name()

    async def run(self, job: Job, *, slot: datetime | None = None) -> JobRun | Skipped:
        """Run ``job`` now: for a scheduled ``slot``, or by hand when there is none."""
        trigger: Trigger = "manual" if slot is None else "schedule"
        conn = await self._connect()
        try:
            if not await try_lock(conn, job.name):
                return Skipped("busy", await self._runs.running(job.name))
            interrupted = await self._runs.close_interrupted(job.name)
            if interrupted:
                log.warning("jobs.interrupted name=%s runs=%d", job.name, interrupted)
            run = await self._runs.start(
                job.name, trigger=trigger, slot=slot, instance=self.instance
            )
            if run is None:
                return Skipped("done")
            return await self._execute(job, run)
        finally:
            await conn.close()  # releases the lock

    async def _execute(self, job: Job, run: JobRun) -> JobRun:
        try:
            result = await job.run(run)
        except asyncio.CancelledError:
            await self._runs.fail(run.id, "cancelled: the process was stopped")
            log.warning("jobs.cancelled name=%s run=%d", job.name, run.id)
            raise
        except Exception as exc:
            log.exception("jobs.failed name=%s run=%d", job.name, run.id)
            reason = str(exc).splitlines()[0] if str(exc) else ""
            return await self._runs.fail(run.id, f"{type(exc).__name__}: {reason}".rstrip(": "))
        return await self._runs.finish(run.id, result.summary, result.details)


class JobScheduler:
    """apscheduler's asyncio scheduler firing each scheduled job into a `JobRunner`.

    The runs are tasks of this scheduler's own, not apscheduler's, so that stopping waits
    for them to record how they ended before the pool closes.
    """

    def __init__(self, jobs: Iterable[Job], runner: JobRunner, zone: tzinfo) -> None:
        self._jobs = [job for job in jobs if job.schedule is not None]
        self._runner = runner
        self._zone = zone
        self._running: dict[str, asyncio.Task[None]] = {}

    async def run(self) -> None:
        """Fire jobs on their schedules until cancelled."""
        scheduler = AsyncIOScheduler(event_loop=asyncio.get_running_loop(), timezone=self._zone)
        for job in self._jobs:
            assert job.schedule is not None
            scheduler.add_job(
                self._fire,
                trigger=job.schedule.trigger(),
                args=(job,),
                id=job.name,
                name=job.name,
                coalesce=True,
                max_instances=1,
                misfire_grace_time=job.schedule.grace,
            )
        scheduler.start()
        log.info(
            "jobs.started instance=%s jobs=%s",
            self._runner.instance,
            ",".join(f"{j.name}({j.schedule.describe()})" for j in self._jobs if j.schedule)
            or "none",
        )
        try:
            await asyncio.Event().wait()
        finally:
            scheduler.shutdown(wait=False)
            running = list(self._running.values())
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            log.info("jobs.stopped")

    async def _fire(self, job: Job) -> None:
        assert job.schedule is not None
        slot = job.schedule.slot(datetime.now(UTC))
        if job.name in self._running:
            log.info("jobs.skipped name=%s slot=%s reason=still_running", job.name, _iso(slot))
            return
        task = asyncio.create_task(self._run(job, slot), name=f"job:{job.name}")
        self._running[job.name] = task
        task.add_done_callback(lambda _: self._running.pop(job.name, None))

    async def _run(self, job: Job, slot: datetime) -> None:
        try:
            outcome = await self._runner.run(job, slot=slot)
        except Exception:
            # The database was unreachable for the lock or the record; the next slot retries.
            log.exception("jobs.error name=%s slot=%s", job.name, _iso(slot))
            return
        if isinstance(outcome, Skipped):
            log.info("jobs.skipped name=%s slot=%s reason=%s", job.name, _iso(slot), outcome.reason)
        else:
            log.info(
                "jobs.ran name=%s slot=%s run=%d status=%s summary=%s",
                job.name,
                _iso(slot),
                outcome.id,
                outcome.status,
                outcome.summary if outcome.status == "ok" else outcome.error,
            )


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds")
