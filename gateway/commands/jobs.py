"""`parley jobs list` and `parley jobs run NAME`: the scheduled jobs, for operators."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime, tzinfo
from typing import Any

from core.errors import Conflict, NotFound
from core.jobs.scheduler import Skipped, job_schedules, jobs_zone
from core.settings import JOB_NAMES
from core.store.job_runs import JobRuns
from gateway.runtime import Runtime, open_answering
from gateway.scheduled import job_runner, open_jobs


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    jobs = commands.add_parser("jobs", help="list the scheduled jobs, or run one now")
    actions = jobs.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="each job's schedule, next run and last run")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    run = actions.add_parser(
        "run", help="run a job now, unless it is running already somewhere; print its summary"
    )
    run.add_argument("name", metavar="NAME", help=", ".join(JOB_NAMES))


def _when(moment: datetime | None, zone: tzinfo) -> str | None:
    return moment.astimezone(zone).isoformat(timespec="seconds") if moment else None


async def _list(args: argparse.Namespace, runtime: Runtime) -> None:
    settings = runtime.settings
    zone = jobs_zone(settings)
    now = datetime.now(UTC)
    latest = await JobRuns(runtime.database.pool).latest()
    rows: list[dict[str, Any]] = []
    for name, schedule in job_schedules(settings).items():
        last = latest.get(name)
        rows.append(
            {
                "name": name,
                "schedule": schedule.describe() if schedule else "off",
                # Nothing fires while this setting is off, whatever the schedule says.
                "next_run": _when(schedule.next_after(now), zone)
                if schedule and settings.jobs
                else None,
                "last_status": last.status if last else None,
                "last_started": _when(last.started_at, zone) if last else None,
                "last_instance": last.instance if last else None,
                "last_summary": (last.summary or last.error) if last else None,
            }
        )
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return
    table = [("NAME", "SCHEDULE", "NEXT RUN", "LAST RUN")] + [
        (
            row["name"],
            row["schedule"],
            row["next_run"] or "-",
            f"{row['last_status']} {row['last_started']}" if row["last_status"] else "never",
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(4)]
    for line in table:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )
    if not settings.jobs:
        print("the scheduler is off in this configuration (PARLEY_JOBS=off)")


async def _run(args: argparse.Namespace, runtime: Runtime) -> int:
    if args.name not in JOB_NAMES:
        raise NotFound(f"unknown job {args.name!r}; the jobs are {', '.join(JOB_NAMES)}")
    async with open_answering(runtime) as answering, open_jobs(answering) as jobs:
        outcome = await job_runner(runtime).run(jobs[args.name])
    if isinstance(outcome, Skipped):
        holder = outcome.holder
        where = (
            f" on {holder.instance} since {_when(holder.started_at, jobs_zone(runtime.settings))}"
            if holder
            else ""
        )
        raise Conflict(f"job {args.name} is running already{where}; try again when it is done")
    if outcome.status != "ok":
        print(f"parley: error: job {args.name} failed: {outcome.error}", file=sys.stderr)
        return 1
    print(f"{args.name}: {outcome.summary}")
    return 0


async def run(args: argparse.Namespace, runtime: Runtime) -> int:
    if args.action == "list":
        await _list(args, runtime)
        return 0
    return await _run(args, runtime)
