"""The durable messaging services: the inbox worker and the outbox sender, on the process's
one answer pipeline and senders, for every channel in the registry."""

from __future__ import annotations

from channels.registry import BY_NAME
from core.jobs.inbox_worker import InboxWorker
from core.jobs.outbox_sender import OutboxSender
from core.jobs.turn_time import longest_turn
from core.store.inbox import Backoff
from gateway.runtime import Answering

# A stopping outbox sender lets its sends in flight end: each gives up within its lease.
SEND_GRACE = 60.0


async def run_inbox_worker(answering: Answering) -> None:
    """Answers the messaging channels' inbox rows with the shared pipeline, until cancelled."""
    runtime = answering.runtime
    settings = runtime.settings
    await InboxWorker(
        runtime.database.pool,
        answering.pipeline,
        burst_window=settings.burst_window_seconds,
        concurrency=settings.worker_concurrency,
        cpu_slots=settings.worker_cpu_slots,
        limits=runtime.model_limits,
        redo_when_superseded=settings.redo_when_superseded,
        channels=BY_NAME,
        senders=answering.senders,
        transcripts=answering.voice,
        memory=answering.pipeline.memory,
        backoff=Backoff(limit=settings.inbox_retry_hours * 3600),
        holding_after=settings.holding_message_seconds,
        queued=runtime.outbox_queued.set,
        defer=runtime.intake.behind,
        # Told to stop, it lets the turns it has begun finish, however slow the model.
        grace=longest_turn(settings),
    ).run()


async def run_outbox_sender(answering: Answering) -> None:
    """Sends queued reply parts, each with its agent's channel account, until cancelled.

    A channel an agent has no credentials for has no sender; its parts fail with
    ``no_sender``.
    """
    runtime = answering.runtime
    await OutboxSender(
        runtime.database.pool, answering.senders, wake=runtime.outbox_queued, grace=SEND_GRACE
    ).run()
