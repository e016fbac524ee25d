"""The outbox and its sender: claims in order, leases, retries and provider errors, on fakes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from channels.telegram_send import TelegramSender
from channels.twilio_send import TwilioSender
from core.jobs.outbox_sender import OutboxSender
from core.retrieval.embedders import EmbedderIdentity, UseEmbedder
from core.store import Agent, Agents, Database
from core.store.outbox import Outbox, OutboxRow, enqueue
from tests.fakes.telegram import BLOCKED, FakeTelegram, flood
from tests.fakes.twilio import FakeTwilio
from tests.integration.test_inbox_worker import wait_until

WHATSAPP_FROM = "whatsapp:+14155238886"
ALICE = "whatsapp:+31612345678"


@dataclass
class Rig:
    database: Database
    agent: Agent
    twilio: FakeTwilio
    telegram: FakeTelegram
    senders: dict[str, Any]
    outbox: Outbox

    def sender(self, **options: Any) -> OutboxSender:
        values: dict[str, Any] = {"poll_interval": 0.05, "base_backoff": 0.05}
        return OutboxSender(self.database.pool, self.senders, **{**values, **options})

    async def enqueue(self, channel: str, recipient: str, parts: list[str]) -> list[int]:
        return await enqueue(
            self.database.pool,  # type: ignore[arg-type]  # a pool runs one statement fine
            agent_id=self.agent.id,
            channel=channel,
            recipient=recipient,
            parts=parts,
        )

    async def rows(self) -> list[OutboxRow]:
        return await self.outbox.rows(self.agent.id)

    async def settled(self) -> bool:
        rows = await self.rows()
        return bool(rows) and all(r.status in ("sent", "failed") for r in rows)

    async def drain(self, sender: OutboxSender) -> None:
        """Run the sender until every row is sent or failed."""

        async def done() -> bool:
            await sender.send_due()
            return await self.settled()

        await wait_until(done)


@pytest.fixture
async def rig(database: Database, use_embedder: UseEmbedder) -> AsyncIterator[Rig]:
    agent = await Agents(database.pool).create("shop", embedder=EmbedderIdentity.of(use_embedder))
    twilio, telegram = FakeTwilio(), FakeTelegram()
    twilio_server, telegram_server = TestServer(twilio.app()), TestServer(telegram.app())
    await twilio_server.start_server()
    await telegram_server.start_server()
    senders: dict[str, Any] = {
        "whatsapp": TwilioSender(
            twilio.account_sid,
            twilio.auth_token,
            WHATSAPP_FROM,
            api_base=str(twilio_server.make_url("")),
            timeout=5.0,
        ),
        "telegram": TelegramSender(
            telegram.token, api_base=str(telegram_server.make_url("")), timeout=5.0
        ),
    }
    yield Rig(database, agent, twilio, telegram, senders, Outbox(database.pool))
    for sender in senders.values():
        await sender.close()
    await twilio_server.close()
    await telegram_server.close()


async def test_parts_are_claimed_one_at_a_time_per_chat(rig: Rig) -> None:
    await rig.enqueue("whatsapp", ALICE, ["one", "two"])
    await rig.enqueue("whatsapp", "whatsapp:+31600000000", ["other"])
    claimed = await rig.outbox.claim(10, lease=30.0)
    assert [(r.recipient, r.part) for r in claimed] == [
        (ALICE, 0),
        ("whatsapp:+31600000000", 0),
    ]
    assert all(r.status == "sending" and r.attempts == 1 for r in claimed)
    assert await rig.outbox.claim(10, lease=30.0) == []  # "two" waits for "one"
    await rig.outbox.mark_sent(claimed[0].id, "SM1")
    [second] = await rig.outbox.claim(10, lease=30.0)
    assert (second.body, second.part) == ("two", 1)


async def test_an_expired_lease_is_claimed_again(rig: Rig) -> None:
    await rig.enqueue("whatsapp", ALICE, ["one"])
    [first] = await rig.outbox.claim(10, lease=0.05)
    await wait_until(lambda: _claim_again(rig), timeout=5.0)
    row = (await rig.rows())[0]
    assert row.id == first.id
    assert row.attempts == 2


async def _claim_again(rig: Rig) -> bool:
    return bool(await rig.outbox.claim(10, lease=30.0))


async def test_parts_are_sent_in_order_and_the_provider_id_recorded(rig: Rig) -> None:
    await rig.enqueue("whatsapp", ALICE, ["first", "second", "third"])
    await rig.drain(rig.sender())
    assert rig.twilio.bodies == ["first", "second", "third"]
    rows = await rig.rows()
    assert [r.provider_message_id for r in rows] == [m["sid"] for m in rig.twilio.messages]
    assert all(r.status == "sent" and r.attempts == 1 for r in rows)
    # Sent rows are never claimed again: a restart does not resend them.
    assert await rig.sender().send_due() == 0


async def test_rate_limits_and_server_errors_are_retried(rig: Rig) -> None:
    rig.twilio.fail_next = [(429, None, "0"), (500, None), (503, None)]
    await rig.enqueue("whatsapp", ALICE, ["hello", "world"])
    await rig.drain(rig.sender())
    assert rig.twilio.bodies == ["hello", "world"]
    assert [r["status"] for r in rig.twilio.requests] == [429, 500, 503, 201, 201]
    rows = await rig.rows()
    assert [(r.status, r.attempts) for r in rows] == [("sent", 4), ("sent", 1)]
    assert rows[0].error_code is None


async def test_retry_after_is_respected(rig: Rig) -> None:
    rig.twilio.fail_next = [(429, None, "30")]
    await rig.enqueue("whatsapp", ALICE, ["hello"])
    sender = rig.sender()
    assert await sender.send_due() == 1
    assert await sender.send_due() == 0  # not due for 30 s, despite a 0.05 s backoff
    due = await rig.database.pool.fetchval(
        "SELECT next_attempt_at - now() > interval '25 seconds' FROM outbox"
    )
    assert due is True
    [row] = await rig.rows()
    assert (row.status, row.error_code) == ("pending", "20429")


async def test_a_permanent_error_is_not_retried_and_keeps_its_code(rig: Rig) -> None:
    rig.twilio.fail_next = [(400, 21617)]
    await rig.enqueue("whatsapp", ALICE, ["too long, says the fake"])
    await rig.drain(rig.sender())
    [row] = await rig.rows()
    assert (row.status, row.error_code, row.attempts) == ("failed", "21617", 1)
    assert "1600" in (row.error_message or "")
    assert len(rig.twilio.requests) == 1


async def test_outside_the_window_is_permanent(rig: Rig) -> None:
    rig.twilio.fail_next = [(400, 63016)]
    await rig.enqueue("whatsapp", ALICE, ["hello"])
    await rig.drain(rig.sender())
    [row] = await rig.rows()
    assert (row.status, row.error_code) == ("failed", "63016")


async def test_attempts_are_bounded(rig: Rig) -> None:
    rig.twilio.fail_next = [(500, None)] * 10
    await rig.enqueue("whatsapp", ALICE, ["hello"])
    await rig.drain(rig.sender(max_attempts=3, base_backoff=0.01))
    [row] = await rig.rows()
    assert (row.status, row.attempts, row.error_code) == ("failed", 3, "20500")
    assert len(rig.twilio.requests) == 3


async def test_telegram_flood_is_retried_and_a_blocked_bot_fails(rig: Rig) -> None:
    rig.telegram.fail_next = [flood(0)]
    await rig.enqueue("telegram", "501", ["first", "second"])
    await rig.drain(rig.sender())
    assert [(m["chat_id"], m["text"]) for m in rig.telegram.messages] == [
        (501, "first"),
        (501, "second"),
    ]
    rig.telegram.fail_next = [BLOCKED]
    await rig.enqueue("telegram", "502", ["hello"])
    await rig.drain(rig.sender())
    rows = await rig.rows()
    assert [(r.recipient, r.status, r.error_code) for r in rows] == [
        ("501", "sent", None),
        ("501", "sent", None),
        ("502", "failed", "forbidden"),
    ]


async def test_a_channel_without_a_sender_fails_its_rows(rig: Rig) -> None:
    await rig.enqueue("sms", "+31612345678", ["hello"])
    await rig.drain(OutboxSender(rig.database.pool, {}))
    [row] = await rig.rows()
    assert (row.status, row.error_code) == ("failed", "no_sender")
