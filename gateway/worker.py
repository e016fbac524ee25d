"""`parley worker`: the background process, sharing the gateway's store and cache, no HTTP.

Background services (inbox workers, outbox sender, scheduled jobs) are long-running
coroutines registered in `SERVICES`; `parley serve` runs the same ones in-process.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Coroutine
from typing import Any

from core.answer.question import load_language_models
from core.jobs.turn_time import longest_turn
from core.settings import Settings
from gateway.durable import SEND_GRACE, run_inbox_worker, run_outbox_sender
from gateway.notifications import run_notifier
from gateway.runtime import SUMMARY_DRAIN_SECONDS, Answering, open_answering, open_runtime
from gateway.scheduled import run_scheduler

log = logging.getLogger(__name__)

Service = Callable[[Answering], Coroutine[Any, Any, None]]

# Filled as the durable channels and the scheduler land; each runs until cancelled.
SERVICES: dict[str, Service] = {
    "inbox": run_inbox_worker,
    "outbox": run_outbox_sender,
    "jobs": run_scheduler,
    "notify": run_notifier,
}


async def run_worker(settings: Settings) -> None:
    # A connection per work slot, and a few for claims, lease renewals, the outbox and jobs.
    async with (
        open_runtime(settings, pool_size=settings.worker_cpu_slots + 4) as runtime,
        open_answering(runtime) as answering,
    ):
        await asyncio.to_thread(load_language_models)
        await _run_until_signalled(answering)


def start_services(answering: Answering) -> list[asyncio.Task[None]]:
    """Every background service as a task of its own (`parley worker` and `parley serve`)."""
    tasks = [
        asyncio.create_task(service(answering), name=name) for name, service in SERVICES.items()
    ]
    log.info("services.started services=%s", ",".join(SERVICES) or "none")
    return tasks


def stop_grace(settings: Settings) -> float:
    """Seconds a worker may take to stop without cutting anything short: the slowest turn the
    settings allow, then the sends those turns queued, then the summaries being written."""
    return longest_turn(settings) + SEND_GRACE + SUMMARY_DRAIN_SECONDS


# Stopped before the others: its turns in flight may still finish and queue their replies,
# which the outbox sender, still running, then sends.
STOPPED_FIRST = ("inbox",)


def begin_stopping(tasks: list[asyncio.Task[None]]) -> None:
    """Tell the services stopped first to stop (the inbox worker claims no more and lets its
    turns finish), without waiting: `stop_services` waits for them."""
    for task in tasks:
        if task.get_name() in STOPPED_FIRST and not task.cancelling():
            task.cancel()


async def stop_services(tasks: list[asyncio.Task[None]]) -> None:
    """Stop the services and wait for them, the inbox worker first; a service that had failed
    is logged once."""
    first = [task for task in tasks if task.get_name() in STOPPED_FIRST]
    for group in (first, [task for task in tasks if task not in first]):
        for task in group:
            if not task.cancelling():  # stopping already: let it finish
                task.cancel()
        results = await asyncio.gather(*group, return_exceptions=True)
        for task, result in zip(group, results, strict=True):
            if isinstance(result, Exception):
                log.error("services.failed service=%s error=%r", task.get_name(), result)


async def _run_until_signalled(answering: Answering) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = start_services(answering)
    log.info(
        "worker.started services=%s grace=%.0f",
        ",".join(SERVICES) or "none",
        stop_grace(answering.runtime.settings),  # what a stop may take: see the manifests
    )
    waiter = asyncio.create_task(stop.wait())
    await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    # A second signal stops at once: the turns still running give their messages back.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _stop_now, tasks)
    log.info("worker.stopping")
    await stop_services(tasks)
    log.info("worker.stopped")


def _stop_now(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
