"""Webhook deliveries into the inbox, those that arrive together written by one statement.

Under load most of a webhook's cost is its round trips to PostgreSQL: the INSERT, and the
reset the pool runs on the connection afterwards. Deliveries that come in while earlier ones
are being written wait for the next statement and go in together, so a burst costs a few
statements instead of one (and a commit) each. A delivery that arrives while a writer is free
goes out at once, on its own, as before: batching adds no wait when there is nothing to wait
for. Each caller is answered only once its row is committed, so a provider still gets its 200
only after the message is stored.

One bad row cannot fail the others written with it: when a statement of several rows is
refused for what is in them, each is written again on its own and gets its own answer.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg

from core.inbound import InboundMessage

# Deliveries written at once: a statement stays a few milliseconds however big the burst.
MAX_ROWS = 200
# Statements in flight at once: the rest of the pool stays free for everything else.
WRITERS = 4

# Rows as columns, in the order given: ids, and so the order of a chat's messages, follow it.
_INSERT = """
    INSERT INTO inbox (agent_id, channel, provider_message_id, conversation_key, payload, message)
    SELECT agent_id, channel, provider_message_id, conversation_key, payload::jsonb, message::jsonb
      FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
           WITH ORDINALITY AS d(agent_id, channel, provider_message_id, conversation_key,
                                payload, message, n)
     ORDER BY n
    ON CONFLICT (agent_id, channel, provider_message_id) DO NOTHING
    RETURNING agent_id, channel, provider_message_id"""

# The database or the connection is away: every row would fail alike, one by one too.
_UNAVAILABLE = (
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
)

_Key = tuple[int, str, str]


@dataclass(slots=True)
class _Delivery:
    key: _Key  # agent, channel, provider id: the inbox's unique key
    conversation_key: str
    payload: str  # JSON
    message: str  # JSON
    stored: asyncio.Future[bool]  # True: written now; False: stored before (a re-delivery)


class InboxWriter:
    """Adds deliveries to the inbox, up to ``writers`` statements at once, each of up to
    ``max_rows`` deliveries: those waiting when a writer is free."""

    def __init__(
        self, pool: asyncpg.Pool, *, writers: int = WRITERS, max_rows: int = MAX_ROWS
    ) -> None:
        self._pool = pool
        self._writers = writers
        self._max_rows = max_rows
        self._waiting: deque[_Delivery] = deque()
        self._running: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def add(
        self, agent_id: int, channel: str, message: InboundMessage, payload: Mapping[str, Any]
    ) -> bool:
        """Store one delivery; False when its provider id was stored before."""
        loop = asyncio.get_running_loop()
        delivery = _Delivery(
            (agent_id, channel, message.provider_message_id),
            message.customer_id,
            json.dumps(dict(payload)),
            json.dumps(message.to_json()),
            loop.create_future(),
        )
        if self._loop is not loop:
            if self._running:
                # Deliveries are queued for one event loop; another loop's are written alone.
                return await self._write_alone(delivery)
            self._loop = loop
        self._waiting.append(delivery)
        if len(self._running) < self._writers:
            task = loop.create_task(self._write_waiting())
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        return await delivery.stored

    async def _write_alone(self, delivery: _Delivery) -> bool:
        await self._write([delivery])
        return await delivery.stored

    async def _write_waiting(self) -> None:
        """Write what is waiting, a statement at a time, until nothing is."""
        batch: list[_Delivery] = []
        try:
            while self._waiting:
                batch = []
                while self._waiting and len(batch) < self._max_rows:
                    delivery = self._waiting.popleft()
                    if not delivery.stored.done():  # else its caller has gone
                        batch.append(delivery)
                if batch:
                    await self._write(batch)
        except BaseException:
            # Cancelled (the process is stopping): no caller waits for ever.
            for delivery in [*batch, *self._waiting]:
                if not delivery.stored.done():
                    delivery.stored.cancel()
            self._waiting.clear()
            raise

    async def _write(self, batch: list[_Delivery]) -> None:
        """One statement for ``batch``; its callers answered whatever happens."""
        first: dict[_Key, _Delivery] = {}
        for delivery in batch:
            first.setdefault(delivery.key, delivery)
        rows = list(first.values())
        try:
            written = await self._pool.fetch(
                _INSERT,
                [d.key[0] for d in rows],
                [d.key[1] for d in rows],
                [d.key[2] for d in rows],
                [d.conversation_key for d in rows],
                [d.payload for d in rows],
                [d.message for d in rows],
            )
        except Exception as exc:
            refused = isinstance(exc, asyncpg.PostgresError) and not isinstance(exc, _UNAVAILABLE)
            if refused and len(batch) > 1:
                # Something in one of the rows: each is written, and answered, alone.
                for delivery in batch:
                    await self._write([delivery])
                return
            for delivery in batch:
                if not delivery.stored.done():
                    delivery.stored.set_exception(exc)
            return
        added = {(r["agent_id"], r["channel"], r["provider_message_id"]) for r in written}
        for delivery in batch:
            if not delivery.stored.done():
                # A second delivery of one id in the same statement is a re-delivery.
                delivery.stored.set_result(
                    first[delivery.key] is delivery and delivery.key in added
                )
