"""The outbox and its sender: claims in order, leases, retries and provider errors, on fakes."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest
from aiohttp.test_utils import TestServer

from channels.telegram_send import TelegramSender
from channels.twilio_send import TwilioSender
from core.jobs.outbox_sender import OutboxSender
from core.retrieval.embedders import UseEmbedder
from core.store import Agent, Agents, Database
from core.store.outbox import Outbox, OutboxRow, enqueue
from core.store.vector_index import EmbedderIdentity
from tests.fakes.telegram import BLOCKED, FakeTelegram, flood
from tests.fakes.twilio import FakeTwilio
from tests.support.waiting import wait_until

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
    twilio_url: str
    telegram_url: str

    def impatient(self, timeout: float = 0.3) -> None:
        """Senders that give up on an answer after ``timeout`` seconds (the fakes answer
        late when told to)."""
        self.senders["whatsapp"] = TwilioSender(
            self.twilio.account_sid,
            self.twilio.auth_token,
            WHATSAPP_FROM,
            api_base=self.twilio_url,
            timeout=timeout,
        )
        self.senders["telegram"] = TelegramSender(
            self.telegram.token, api_base=self.telegram_url, timeout=timeout
        )

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
    twilio_url, telegram_url = str(twilio_server.make_url("")), str(telegram_server.make_url(""))
    senders: dict[str, Any] = {
        "whatsapp": TwilioSender(
            twilio.account_sid, twilio.auth_token, WHATSAPP_FROM, api_base=twilio_url, timeout=5.0
        ),
        "telegram": TelegramSender(telegram.token, api_base=telegram_url, timeout=5.0),
    }
    rig = Rig(
        database, agent, twilio, telegram, senders, Outbox(database.pool), twilio_url, telegram_url
    )
    yield rig
    for sender in rig.senders.values():
        await sender.close()
    await twilio_server.close()
    await telegram_server.close()


async def test_a_sender_stops_when_stopped_as_it_is_woken(rig: Rig) -> None:
    """Shutting down while a part is being queued must stop the sender, not leave it
    running: a cancellation that arrives as the wake-up does is the one that counts."""
    wake = asyncio.Event()
    sender = rig.sender(poll_interval=30.0, wake=wake)
    task = asyncio.create_task(sender.run())

    # Idle: nothing to send, so it waits for the next wake-up.
    async def waiting() -> bool:
        return len(getattr(wake, "_waiters", ())) == 1

    await wait_until(waiting)
    wake.set()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5)
    assert task in done, "the sender ran on after it was cancelled"
    assert task.cancelled()


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


# -- sends whose answer never came ---------------------------------------------------------


async def test_twilio_accepting_but_answering_late_sends_each_part_once(rig: Rig) -> None:
    rig.impatient(timeout=0.3)
    rig.twilio.answer_late_by = 3.0  # every message is accepted, every answer comes too late
    await rig.enqueue("whatsapp", ALICE, ["first", "second", "third", "fourth"])

    await rig.drain(rig.sender())

    assert rig.twilio.bodies == ["first", "second", "third", "fourth"]  # none twice
    rows = await rig.rows()
    assert [r.provider_message_id for r in rows] == [m["sid"] for m in rig.twilio.messages]
    assert [(r.status, r.attempts, r.unconfirmed_since) for r in rows] == [("sent", 2, None)] * 4
    # one look-up per part, for this chat, from the sender, from the day the attempt began
    assert len(rig.twilio.lists) == 4
    assert {(q["To"], q["From"]) for q in rig.twilio.lists} == {(ALICE, WHATSAPP_FROM)}
    assert all("DateSent>" in q for q in rig.twilio.lists)


async def test_a_refused_twilio_send_is_sent_again_without_a_look_up(rig: Rig) -> None:
    rig.twilio.fail_next = [(500, None)]
    await rig.enqueue("whatsapp", ALICE, ["hello"])
    sender = rig.sender()
    assert await sender.send_due() == 1
    [row] = await rig.rows()
    assert (row.status, row.error_code, row.unconfirmed_since) == ("pending", "20500", None)

    await rig.drain(sender)

    assert rig.twilio.bodies == ["hello"]
    assert rig.twilio.lists == []  # a refusal is certain: nothing to ask about
    [row] = await rig.rows()
    assert (row.status, row.attempts) == ("sent", 2)


async def test_a_twilio_send_that_cannot_connect_is_sent_again_and_lands_once(
    database: Database, use_embedder: UseEmbedder
) -> None:
    agent = await Agents(database.pool).create("shop", embedder=EmbedderIdentity.of(use_embedder))
    twilio = FakeTwilio()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sender = TwilioSender(
        twilio.account_sid,
        twilio.auth_token,
        WHATSAPP_FROM,
        api_base=f"http://127.0.0.1:{port}",
        timeout=5.0,
    )
    outbox = OutboxSender(database.pool, {"whatsapp": sender}, base_backoff=0.05)
    await enqueue(
        database.pool,  # type: ignore[arg-type]
        agent_id=agent.id,
        channel="whatsapp",
        recipient=ALICE,
        parts=["hello"],
    )
    server = TestServer(twilio.app(), port=port)
    try:
        assert await outbox.send_due() == 1  # nothing listens yet: connection refused
        [row] = await Outbox(database.pool).rows(agent.id)
        assert (row.status, row.error_code, row.unconfirmed_since) == (
            "pending",
            "connection",
            None,
        )

        await server.start_server()

        async def sent() -> bool:
            await outbox.send_due()
            return (await Outbox(database.pool).rows(agent.id))[0].status == "sent"

        await wait_until(sent)
    finally:
        await sender.close()
        await server.close()
    assert twilio.bodies == ["hello"]
    assert twilio.lists == []


async def test_a_failed_look_up_is_tried_again_before_anything_is_resent(rig: Rig) -> None:
    rig.impatient(timeout=0.3)
    rig.twilio.answer_late_by = 3.0
    rig.twilio.fail_list_next = [(503, None)]
    await rig.enqueue("whatsapp", ALICE, ["hello"])

    await rig.drain(rig.sender())

    assert rig.twilio.bodies == ["hello"]
    assert len(rig.twilio.lists) == 2  # the failed look-up, then the one that found it
    [row] = await rig.rows()
    assert (row.status, row.provider_message_id) == ("sent", rig.twilio.messages[0]["sid"])
    assert (row.attempts, row.lookups) == (3, 0)


async def test_when_look_ups_keep_failing_the_part_is_sent_again(rig: Rig) -> None:
    """The documented choice: after ``max_lookups`` failed look-ups the part is re-sent, so
    a look-up that keeps failing cannot hold the chat's replies up for ever."""
    rig.impatient(timeout=0.3)
    rig.twilio.answer_late_by = 3.0
    rig.twilio.fail_list_next = [(500, None)] * 10
    await rig.enqueue("whatsapp", ALICE, ["hello"])
    sender = rig.sender(max_lookups=2)
    assert await sender.send_due() == 1  # accepted, but the answer came too late
    rig.twilio.answer_late_by = 0.0

    await rig.drain(sender)

    assert len(rig.twilio.lists) == 2
    assert rig.twilio.bodies == ["hello", "hello"]  # the repeat this choice accepts
    [row] = await rig.rows()
    assert (row.status, row.provider_message_id) == ("sent", rig.twilio.messages[1]["sid"])


async def test_a_part_a_dead_sender_had_sent_is_found_not_resent(rig: Rig) -> None:
    await rig.enqueue("whatsapp", ALICE, ["hello"])
    [claimed] = await rig.outbox.claim(10, lease=0.05)
    # The sender that claimed it got the message out, then died before recording it.
    sent = await rig.senders["whatsapp"].send(ALICE, claimed.body)

    await rig.drain(rig.sender())

    assert rig.twilio.bodies == ["hello"]
    [row] = await rig.rows()
    assert (row.status, row.provider_message_id, row.attempts) == (
        "sent",
        sent.provider_message_id,
        2,
    )


async def test_an_earlier_identical_part_is_not_adopted(rig: Rig) -> None:
    """A look-up may see an identical message sent just before; it belongs to another part."""
    await rig.enqueue("whatsapp", ALICE, ["Thanks!"])
    await rig.drain(rig.sender())
    await rig.enqueue("whatsapp", ALICE, ["Thanks!"])
    rig.twilio.fail_next = [(500, None)]
    assert len(await rig.outbox.claim(10, lease=0.05)) == 1  # a sender that dies unsent

    await rig.drain(rig.sender())

    assert rig.twilio.bodies == ["Thanks!", "Thanks!"]
    rows = await rig.rows()
    assert [r.provider_message_id for r in rows] == [m["sid"] for m in rig.twilio.messages]
    assert len(rig.twilio.lists) == 1


async def test_telegram_cannot_be_asked_so_an_unanswered_part_is_sent_again(rig: Rig) -> None:
    """The window README's "What can be lost or repeated" names: Telegram's Bot API has no
    look-up, so a part whose answer never came is sent again and may arrive twice."""
    rig.impatient(timeout=0.3)
    rig.telegram.answer_late_by = 3.0
    await rig.enqueue("telegram", "501", ["hello"])
    sender = rig.sender()
    assert await sender.send_due() == 1
    [row] = await rig.rows()
    assert (row.status, row.error_code) == ("pending", "timeout")
    assert row.unconfirmed_since is not None  # recorded, though nothing can settle it
    rig.telegram.answer_late_by = 0.0

    await rig.drain(sender)

    assert rig.telegram.texts == ["hello", "hello"]
    [row] = await rig.rows()
    assert (row.status, row.provider_message_id) == ("sent", "2")


async def test_the_sender_outlives_a_database_outage(
    rig: Rig, database_url: str, postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    name = urlsplit(database_url).path.lstrip("/")
    admin = await asyncpg.connect(postgres_url)
    # One connection of the test's own that the outage spares, to queue a part while it lasts.
    spared = await asyncpg.connect(database_url)
    sender = asyncio.ensure_future(rig.sender().run())
    try:
        await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        await admin.execute(
            """SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                WHERE datname = $1 AND pid <> $2""",
            name,
            spared.get_server_pid(),
        )
        await enqueue(
            spared, agent_id=rig.agent.id, channel="whatsapp", recipient=ALICE, parts=["Hi!"]
        )

        async def sender_saw_the_outage() -> bool:
            return any("outbox.poll.failed" in r.getMessage() for r in caplog.records)

        await wait_until(sender_saw_the_outage)
        assert not sender.done()
    finally:
        await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        await admin.close()
        await spared.close()
    try:
        await wait_until(rig.settled)
        assert rig.twilio.bodies == ["Hi!"]
        [row] = await rig.rows()
        assert row.status == "sent"
    finally:
        sender.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sender


async def test_a_send_waiting_on_its_provider_holds_up_no_other_chat(rig: Rig) -> None:
    rig.telegram.answer_late_by = 4.0  # Telegram takes the message and answers only later
    sender = asyncio.ensure_future(rig.sender().run())
    try:

        async def telegram_has_it() -> bool:
            return rig.telegram.texts == ["slow"]

        async def alice_has_both() -> bool:
            return rig.twilio.bodies == ["Hi Alice!", "Second part"]

        await rig.enqueue("telegram", "501", ["slow"])
        await wait_until(telegram_has_it)
        await rig.enqueue("whatsapp", ALICE, ["Hi Alice!", "Second part"])

        await wait_until(alice_has_both)
        # ... while the Telegram send still waits for its answer
        telegram = [r for r in await rig.rows() if r.channel == "telegram"]
        assert [r.status for r in telegram] == ["sending"]
        await wait_until(rig.settled)
        assert rig.telegram.texts == ["slow"]
    finally:
        sender.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sender
