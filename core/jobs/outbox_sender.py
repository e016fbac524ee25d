"""Sends the outbox: claims due reply parts, sends each with its channel's sender, records it."""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress
from datetime import datetime

import asyncpg

from core.delivery import (
    Choice,
    ChoiceSender,
    DeliveryError,
    Sender,
    Senders,
    Sent,
    SentFinder,
    Template,
    TemplateSender,
    sender_of,
)
from core.errors import StoreUnavailable
from core.store.outbox import Outbox, OutboxRow

log = logging.getLogger(__name__)


# Longest pause of the sending loop while the database cannot be reached.
_MAX_LOOP_PAUSE = 30.0
# How long a sender told to stop waits for a claim it was making to come back.
_CLAIM_SETTLES = 5.0

# Failures of the database or the network, logged without a traceback: they mend themselves.
_DOWN: tuple[type[BaseException], ...] = (
    OSError,  # connection refused or reset
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
    asyncpg.InterfaceError,  # the pool was closed, or a connection was lost mid-query
    StoreUnavailable,
)


def _log_poll_failure(exc: Exception, pause: float) -> None:
    if isinstance(exc, _DOWN):
        log.warning("outbox.poll.failed error=%r pause=%.1f", exc, pause)
    else:
        log.exception("outbox.poll.failed pause=%.1f", pause, exc_info=exc)


# Delivery states a found message may already be in, past plain 'sent'.
_LATER_STATES = frozenset({"delivered", "read", "failed", "undelivered"})


class OutboxSender:
    """One loop: claim due parts, send them (different chats at once), record what happened.

    A part the provider accepted is marked sent with its id straight away, so a restart never
    sends it again. Permanent refusals fail the part with the provider's code; anything else
    is retried with exponential backoff (never sooner than the provider's ``retry_after``)
    until ``max_attempts`` claims have been spent.

    An attempt that failed ambiguously (no answer after the request went out) or whose sender
    died leaves the part unconfirmed. Before such a part is sent again, a channel that can be
    asked (`SentFinder`: Twilio) is asked whether it has the message; if so its id is adopted
    and nothing is sent. A failed look-up is tried again with the same backoff; after
    ``max_lookups`` failures in a row (or a refusal, or when the attempts run out) the part is
    sent again instead, because a reply seen twice does less harm than a reply never seen and
    an unsettled part holds up the chat's later replies. Channels without a look-up
    (Telegram) send the part again without asking.

    Every send and look-up must give up well within ``lease`` seconds, or another sender
    could take the part while it is still being sent. Without work it looks again every
    ``poll_interval`` seconds, or as soon as ``wake`` is set (by whatever queued a part).
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        senders: Senders,
        *,
        batch: int = 20,
        lease: float = 60.0,
        poll_interval: float = 0.5,
        base_backoff: float = 2.0,
        max_backoff: float = 600.0,
        max_attempts: int = 8,
        max_lookups: int = 3,
        wake: asyncio.Event | None = None,
        grace: float = 0.0,
    ) -> None:
        self._outbox = Outbox(pool)
        # Stopped, it claims no more and gives the sends in flight this long to end (a send
        # cut short leaves its part unconfirmed for a minute, then settled by another sender).
        self._grace = grace
        # Set when this process queues a part: sent at once rather than at the next poll.
        self._wake = wake or asyncio.Event()
        self._senders = senders
        self._batch = batch
        self._lease = lease
        self._poll = poll_interval
        self._base_backoff = base_backoff
        self._max_backoff = max_backoff
        self._max_attempts = max_attempts
        self._max_lookups = max_lookups

    async def run(self) -> None:
        """Send until cancelled; then let the sends in flight end (within ``grace``).

        Up to ``batch`` parts are in flight at once, each on its own: a send that waits out
        its timeout holds up its own chat, never the others, whose next parts are claimed as
        soon as a send ends or a part is queued.

        The loop outlives a database outage (or any failing claim): it logs, pauses longer
        each time in a row a claim fails, and carries on once it can. A part whose send
        could not be recorded stays claimed; once its lease ends it is settled like one
        whose sender died (looked up where the channel allows, else sent again).
        """
        pause = self._poll
        in_flight: set[asyncio.Task[None]] = set()
        try:
            while True:
                self._wake.clear()  # a part queued or a send ended from here on wakes us
                room = self._batch - len(in_flight)
                claimed = 0
                if room > 0:
                    claiming = asyncio.ensure_future(self._outbox.claim(room, self._lease))
                    try:
                        rows = await asyncio.shield(claiming)
                    except asyncio.CancelledError:
                        # Told to stop mid-claim: what it took is sent with the rest in flight.
                        with suppress(Exception):
                            for row in await asyncio.wait_for(claiming, _CLAIM_SETTLES):
                                self._start(row, in_flight)
                        raise
                    except Exception as exc:
                        pause = min(pause * 2, _MAX_LOOP_PAUSE)
                        _log_poll_failure(exc, pause)
                        await asyncio.sleep(pause)
                        continue
                    pause = self._poll
                    for row in rows:
                        self._start(row, in_flight)
                    claimed = len(rows)
                if not claimed or len(in_flight) >= self._batch:
                    with suppress(TimeoutError):
                        async with asyncio.timeout(self._poll):
                            await self._wake.wait()
        finally:
            try:
                if in_flight and self._grace > 0:
                    await asyncio.wait(in_flight, timeout=self._grace)
            finally:
                for task in in_flight:
                    task.cancel()
                await asyncio.gather(*in_flight, return_exceptions=True)

    def _start(self, row: OutboxRow, in_flight: set[asyncio.Task[None]]) -> None:
        task = asyncio.create_task(self._send_logged(row))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
        task.add_done_callback(lambda _: self._wake.set())

    async def _send_logged(self, row: OutboxRow) -> None:
        try:
            await self._send(row)
        except Exception as exc:  # the row stays claimed; its lease ending settles it
            _log_poll_failure(exc, self._poll)

    async def send_due(self) -> int:
        """Claim and send one batch; the number of parts claimed. Raises the first failure
        of the batch (after every part of it has been tried)."""
        rows = await self._outbox.claim(self._batch, self._lease)
        # At most one row per chat is claimed at a time, so these never race each other.
        results = await asyncio.gather(*(self._send(row) for row in rows), return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                raise result
        return len(rows)

    async def _sender(self, row: OutboxRow) -> Sender | None:
        return await sender_of(self._senders, row.agent_id, row.channel)

    async def _send(self, row: OutboxRow) -> None:
        sender = await self._sender(row)
        if sender is None:
            log.error("outbox.send.no_sender channel=%s outbox_id=%d", row.channel, row.id)
            await self._outbox.mark_failed(row.id, "no_sender", f"no sender for {row.channel}")
            return
        if row.unconfirmed_since is not None and await self._settled(
            row, sender, row.unconfirmed_since
        ):
            return
        try:
            sent = await self._deliver(sender, row)
        except Exception as exc:
            await self._failed(row, exc)
            return
        await self._outbox.mark_sent(row.id, sent.provider_message_id)
        log.info(
            "outbox.send.sent channel=%s outbox_id=%d part=%d attempts=%d",
            row.channel,
            row.id,
            row.part,
            row.attempts,
        )

    async def _deliver(self, sender: Sender, row: OutboxRow) -> Sent:
        if row.choices:
            if not isinstance(sender, ChoiceSender):
                raise DeliveryError(
                    f"{row.channel} has no buttons", code="buttons_unsupported", permanent=True
                )
            choices = [Choice(str(c.get("label", "")), str(c.get("data", ""))) for c in row.choices]
            return await sender.send_choices(row.recipient, row.body, choices)
        if row.template is None:
            return await sender.send(row.recipient, row.body)
        if not isinstance(sender, TemplateSender):
            raise DeliveryError(
                f"{row.channel} has no templates", code="template_unsupported", permanent=True
            )
        template = Template(
            name=str(row.template.get("name", "")),
            provider_id=str(row.template.get("provider_id", "")),
            language=str(row.template.get("language", "")),
            text=row.body,
        )
        values = [str(v) for v in row.template.get("values") or ()]
        return await sender.send_template(row.recipient, template, values)

    async def _settled(self, row: OutboxRow, sender: Sender, since: datetime) -> bool:
        """For a part an earlier attempt may have delivered: True when nothing is to be sent
        now, because the provider has it (its id is adopted) or the look-up is to be retried."""
        if not isinstance(sender, SentFinder):
            log.info(
                "outbox.send.unconfirmed_resend channel=%s outbox_id=%d reason=no_lookup",
                row.channel,
                row.id,
            )
            return False
        try:
            found = await sender.find_sent(row.recipient, row.body, since)
        except Exception as exc:
            return await self._lookup_failed(row, exc)
        ids = [part.provider_message_id for part in found]
        taken = await self._outbox.recorded(row.channel, row.recipient, ids) if ids else set()
        for part in found:
            if part.provider_message_id in taken:
                continue
            provider_id = part.provider_message_id
            await self._outbox.mark_sent(row.id, provider_id)
            # Delivery reports sent before the id was known found no row: take the state now.
            status = part.status
            if status in _LATER_STATES:
                await self._outbox.record_status(
                    row.channel, provider_id, status, None, agent_ids=[row.agent_id]
                )
            log.info(
                "outbox.send.adopted channel=%s outbox_id=%d part=%d attempts=%d",
                row.channel,
                row.id,
                row.part,
                row.attempts,
            )
            return True
        log.info("outbox.send.not_found channel=%s outbox_id=%d", row.channel, row.id)
        return False

    async def _lookup_failed(self, row: OutboxRow, exc: Exception) -> bool:
        code, message, permanent, retry_after = self._describe(row, exc)
        if permanent or row.lookups + 1 >= self._max_lookups or row.attempts >= self._max_attempts:
            # Waiting longer would hold up the chat's later replies for a look-up that keeps
            # failing; a part seen twice does less harm than a part never seen.
            log.warning(
                "outbox.send.unconfirmed_resend channel=%s outbox_id=%d reason=lookup_failed "
                "code=%s lookups=%d",
                row.channel,
                row.id,
                code,
                row.lookups + 1,
            )
            return False
        delay = self._backoff(row, retry_after)
        await self._outbox.retry_lookup(row.id, delay, code, f"look-up failed: {message}")
        log.info(
            "outbox.send.lookup_retry channel=%s outbox_id=%d code=%s lookups=%d delay=%.2f",
            row.channel,
            row.id,
            code,
            row.lookups + 1,
            delay,
        )
        return True

    def _describe(
        self, row: OutboxRow, exc: Exception
    ) -> tuple[str | None, str, bool, float | None]:
        """Code, message, permanence and retry-after of a failure."""
        if isinstance(exc, DeliveryError):
            return exc.code, exc.message, exc.permanent, exc.retry_after
        # Not a classified delivery error: a bug or an unexpected library error. Retried,
        # since giving up on a reply over a glitch is worse than a bounded retry.
        log.exception("outbox.send.unexpected channel=%s outbox_id=%d", row.channel, row.id)
        return "error", type(exc).__name__, False, None

    def _backoff(self, row: OutboxRow, retry_after: float | None) -> float:
        delay: float = min(self._base_backoff * 2 ** (row.attempts - 1), self._max_backoff)
        return delay if retry_after is None else max(delay, retry_after)

    async def _failed(self, row: OutboxRow, exc: Exception) -> None:
        code, message, permanent, retry_after = self._describe(row, exc)
        ambiguous = isinstance(exc, DeliveryError) and exc.ambiguous
        if permanent or row.attempts >= self._max_attempts:
            if ambiguous:
                message += "; the provider may have accepted the last attempt"
            await self._outbox.mark_failed(row.id, code, message)
            log.warning(
                "outbox.send.failed channel=%s outbox_id=%d code=%s attempts=%d permanent=%s",
                row.channel,
                row.id,
                code,
                row.attempts,
                permanent,
            )
            return
        delay = self._backoff(row, retry_after)
        # An ambiguous attempt may have been accepted: the next one asks first. Otherwise any
        # earlier doubt was settled before this attempt (found nothing, or gave up asking).
        since = row.attempt_started_at if ambiguous else None
        await self._outbox.reschedule(row.id, delay, code, message, unconfirmed_since=since)
        log.info(
            "outbox.send.retry channel=%s outbox_id=%d code=%s attempts=%d delay=%.2f "
            "unconfirmed=%s",
            row.channel,
            row.id,
            code,
            row.attempts,
            delay,
            ambiguous,
        )
