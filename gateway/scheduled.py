"""The scheduled jobs of `parley serve` and `parley worker`, built on the process's resources."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

from core.jobs.answer_checks import run_answer_checks
from core.jobs.housekeeping import purge_old, sweep_outbox
from core.jobs.recrawl import recrawl
from core.jobs.scheduler import Job, JobResult, JobRunner, JobScheduler, job_schedules, jobs_zone
from core.knowledge.ingest import Ingestor
from core.memory import catch_up_summaries
from core.store.agents import Agents
from core.store.answer_checks import AnswerChecks
from core.store.database import connect
from core.store.job_runs import JobRun
from core.store.knowledge import KnowledgeStore
from core.store.outbox import Outbox
from core.store.retention import Retention
from gateway.runtime import Answering, Runtime

# The summaries job looks at conversations active this recently (the query stays cheap).
CATCH_UP_WINDOW = timedelta(days=2)

log = logging.getLogger(__name__)


@asynccontextmanager
async def open_jobs(answering: Answering) -> AsyncIterator[dict[str, Job]]:
    """Every job by name, in the order operators see them, ready to run in this process."""
    runtime, pipeline = answering.runtime, answering.pipeline
    settings, pool, agents = runtime.settings, runtime.database.pool, runtime.agents
    knowledge = KnowledgeStore(pool)
    ingestor = Ingestor(knowledge, runtime.embedder, allow_networks=settings.crawl_allow_networks)

    async def summaries(run: JobRun) -> JobResult:
        # Older conversations catch up on their next turn, when their summary is read.
        since = datetime.now(UTC) - CATCH_UP_WINDOW
        written = await catch_up_summaries(pipeline.memory, active_since=since)
        return JobResult(f"{written} summaries brought up to date", {"written": written})

    async def crawl(run: JobRun) -> JobResult:
        return await recrawl(Agents(pool), knowledge, ingestor)

    async def checks(run: JobRun) -> JobResult:
        return await run_answer_checks(AnswerChecks(pool), agents, pipeline, run)

    async def retention(run: JobRun) -> JobResult:
        return await purge_old(Retention(pool), settings.retention_days)

    async def sweep(run: JobRun) -> JobResult:
        return await sweep_outbox(Outbox(pool))

    runs = {
        "summaries": summaries,
        "recrawl": crawl,
        "answer-checks": checks,
        "retention": retention,
        "outbox-sweep": sweep,
    }
    yield {
        name: Job(name, schedule, runs[name]) for name, schedule in job_schedules(settings).items()
    }


def job_runner(runtime: Runtime) -> JobRunner:
    url = runtime.database.url
    return JobRunner(runtime.database.pool, lambda: connect(url))


async def run_scheduler(answering: Answering) -> None:
    """The `jobs` background service: fires the scheduled jobs until cancelled."""
    runtime = answering.runtime
    if not runtime.settings.jobs:
        log.info("jobs.disabled setting=PARLEY_JOBS")
        # Idle rather than return: a service that ends stops the whole worker.
        await asyncio.Event().wait()
        return
    async with open_jobs(answering) as jobs:
        scheduler = JobScheduler(jobs.values(), job_runner(runtime), jobs_zone(runtime.settings))
        await scheduler.run()
