"""Sends the outbox: claims due reply parts, sends each with its channel's sender, records it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import asyncpg

from core.store.outbox import Outbox, OutboxRow

log = logging.getLogger(__name__)


class SentPart(Protocol):
    @property
    def provider_message_id(self) -> str: ...


class PartSender(Protocol):
    """What the sender needs of a channel (`channels.delivery.Sender` fits).

    Failures raise an exception that looks like `DeliveryFailure`; the gateway passes the
    channel senders in, so core never imports a channel.
    """

    async def send(self, recipient: str, text: str) -> Sequence[SentPart]: ...


class SenderDirectory(Protocol):
    """Finds the sender for an agent's channel (each agent may have its own account)."""

    async def sender_for(self, agent_id: int, channel: str) -> PartSender | None: ...


@runtime_checkable
class DeliveryFailure(Protocol):
    """The shape of `channels.delivery.DeliveryError`, recognised without importing it."""

    message: str
    code: str | None
    permanent: bool
    retry_after: float | None


class OutboxSender:
    """One loop: claim due parts, send them (different chats at once), record what happened.

    A part the provider accepted is marked sent with its id straight away, so a restart never
    sends it again. Permanent refusals fail the part with the provider's code; anything else
    is retried with exponential backoff (never sooner than the provider's ``retry_after``)
    until ``max_attempts`` claims have been spent.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        senders: Mapping[str, PartSender] | SenderDirectory,
        *,
        batch: int = 20,
        lease: float = 60.0,
        poll_interval: float = 0.5,
        base_backoff: float = 2.0,
        max_backoff: float = 600.0,
        max_attempts: int = 8,
    ) -> None:
        self._outbox = Outbox(pool)
        self._senders = senders
        self._batch = batch
        self._lease = lease
        self._poll = poll_interval
        self._base_backoff = base_backoff
        self._max_backoff = max_backoff
        self._max_attempts = max_attempts

    async def run(self) -> None:
        """Send until cancelled."""
        while True:
            if not await self.send_due():
                await asyncio.sleep(self._poll)

    async def send_due(self) -> int:
        """Claim and send one batch; the number of parts claimed."""
        rows = await self._outbox.claim(self._batch, self._lease)
        # At most one row per chat is claimed at a time, so these never race each other.
        await asyncio.gather(*(self._send(row) for row in rows))
        return len(rows)

    async def _sender(self, row: OutboxRow) -> PartSender | None:
        if isinstance(self._senders, Mapping):
            return self._senders.get(row.channel)
        return await self._senders.sender_for(row.agent_id, row.channel)

    async def _send(self, row: OutboxRow) -> None:
        sender = await self._sender(row)
        if sender is None:
            log.error("outbox.send.no_sender channel=%s outbox_id=%d", row.channel, row.id)
            await self._outbox.mark_failed(row.id, "no_sender", f"no sender for {row.channel}")
            return
        try:
            sent = await sender.send(row.recipient, row.body)
        except Exception as exc:
            await self._failed(row, exc)
            return
        provider_id = sent[0].provider_message_id if sent else ""
        await self._outbox.mark_sent(row.id, provider_id)
        log.info(
            "outbox.send.sent channel=%s outbox_id=%d part=%d attempts=%d",
            row.channel,
            row.id,
            row.part,
            row.attempts,
        )

    async def _failed(self, row: OutboxRow, exc: Exception) -> None:
        if isinstance(exc, DeliveryFailure):
            code, message = exc.code, exc.message
            permanent, retry_after = exc.permanent, exc.retry_after
        else:
            # Not a classified delivery error: a bug or an unexpected library error. Retried,
            # since giving up on a reply over a glitch is worse than a bounded retry.
            log.exception("outbox.send.unexpected channel=%s outbox_id=%d", row.channel, row.id)
            code, message, permanent, retry_after = "error", type(exc).__name__, False, None
        if permanent or row.attempts >= self._max_attempts:
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
        delay = min(self._base_backoff * 2 ** (row.attempts - 1), self._max_backoff)
        if retry_after is not None:
            delay = max(delay, retry_after)
        await self._outbox.reschedule(row.id, delay, code, message)
        log.info(
            "outbox.send.retry channel=%s outbox_id=%d code=%s attempts=%d delay=%.2f",
            row.channel,
            row.id,
            code,
            row.attempts,
            delay,
        )
