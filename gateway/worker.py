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
from core.settings import Settings
from gateway.durable import run_inbox_worker, run_outbox_sender
from gateway.notifications import run_notifier
from gateway.runtime import Answering, open_answering, open_runtime
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


async def stop_services(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel the services and wait for them; a service that had failed is logged once."""
    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for task, result in zip(tasks, results, strict=True):
        if isinstance(result, Exception):
            log.error("services.failed service=%s error=%r", task.get_name(), result)


async def _run_until_signalled(answering: Answering) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = start_services(answering)
    log.info("worker.started services=%s", ",".join(SERVICES) or "none")
    waiter = asyncio.create_task(stop.wait())
    await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    await stop_services(tasks)
    log.info("worker.stopped")
