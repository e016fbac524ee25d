"""Human handoff end to end: staff take over, reply through each channel, and hand back."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp.test_utils import TestServer
from httpx_sse import aconnect_sse
from twilio.request_validator import RequestValidator

from channels.delivery import split_message
from core.answer.escalation import DEFAULT_HANDOFF_TEXTS, DEFAULT_OUT_OF_HOURS_TEXTS
from core.answer.factory import build_pipeline
from core.cache import RedisCache
from core.errors import InvalidInput
from core.handoff import ConversationFeed, Handoff
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.retrieval.embedders import UseEmbedder
from core.store import Agent, Agents, Database
from core.store.knowledge import KnowledgeStore
from core.store.vector_index import EmbedderIdentity
from core.turns import CollectingTurnOutput, TurnRequest
from gateway.app import create_app
from gateway.keys import HANDOFF
from tests.conftest import MakeSettings
from tests.fakes.telegram import FakeTelegram
from tests.fakes.twilio import FakeTwilio
from tests.support.sse import chat
from tests.support.waiting import wait_until

VISITOR = "whatsapp:+31612345678"
WHATSAPP_FROM = "whatsapp:+14155238886"
TELEGRAM_SECRET = "handoff-secret_0123456789-abcdefghijklm"
CHAT_ID = 424242
SESSION = "session-handoff-0001"
PAGES = [
    {"url": "/en/returns", "title": "Returns", "lang": "en",
     "text": "# Returns\nYou can return any item within 30 days. Refunds arrive within 5 working days."},
    {"url": "/en/shipping", "title": "Shipping", "lang": "en",
     "text": "# Shipping\nOrders to Belgium arrive in 2-3 working days. Shipping costs 4.95 euro."},
]  # fmt: skip


async def _shop(database: Database, embedder: UseEmbedder, tmp_path: Path) -> Agent:
    agents = Agents(database.pool)
    await agents.create("shop", embedder=EmbedderIdentity.of(embedder))
    agent = await agents.update(
        "shop", contact_route="hello@shop.example", allowed_origins=["https://shop.example"]
    )
    path = tmp_path / "pages.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PAGES), encoding="utf-8")
    await Ingestor(KnowledgeStore(database.pool), embedder).ingest(agent, parse_source(str(path)))
    return await agents.get("shop")


@dataclass
class Site:
    """The gateway with its workers, in front of fake Twilio and Telegram servers."""

    database: Database
    agent: Agent
    gateway: TestServer
    twilio: FakeTwilio
    telegram: FakeTelegram
    sent: int = 0
    updates: int = 100

    @property
    def handoff(self) -> Handoff:
        return self.gateway.app[HANDOFF]

    async def whatsapp(self, body: str) -> None:
        self.sent += 1
        url = str(self.gateway.make_url("/webhooks/twilio/shop"))
        fields = {
            "MessageSid": f"SM{self.sent:032d}", "AccountSid": self.twilio.account_sid,
            "From": VISITOR, "To": WHATSAPP_FROM, "Body": body, "NumMedia": "0",
        }  # fmt: skip
        signature = RequestValidator(self.twilio.auth_token).compute_signature(url, fields)
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=fields, headers={"X-Twilio-Signature": signature}) as answer,
        ):
            assert answer.status == 200

    async def telegram_message(self, text: str) -> None:
        self.updates += 1
        update = {
            "update_id": self.updates,
            "message": {
                "message_id": self.updates, "date": 1_717_000_000, "text": text,
                "chat": {"id": CHAT_ID, "type": "private", "first_name": "Ann"},
                "from": {"id": CHAT_ID, "is_bot": False, "first_name": "Ann",
                         "language_code": "en"},
            },
        }  # fmt: skip
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                str(self.gateway.make_url("/webhooks/telegram/shop")),
                json=update,
                headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET},
            ) as answer,
        ):
            assert answer.status == 200

    async def inbox_done(self) -> bool:
        statuses = await self.database.pool.fetch("SELECT status FROM inbox")
        return bool(statuses) and all(r["status"] == "done" for r in statuses)

    async def conversation(self, channel: str, key: str) -> int:
        found: int = await self.database.pool.fetchval(
            "SELECT id FROM conversations WHERE channel = $1 AND conversation_key = $2",
            channel,
            key,
        )
        return found

    async def messages(self, conversation_id: int) -> list[tuple[str, str]]:
        rows = await self.database.pool.fetch(
            "SELECT role, text FROM messages WHERE conversation_id = $1 ORDER BY id",
            conversation_id,
        )
        return [(r["role"], r["text"]) for r in rows]


@pytest.fixture
async def site(
    make_settings: MakeSettings, database: Database, use_embedder: UseEmbedder, tmp_path: Path
) -> AsyncIterator[Site]:
    agent = await _shop(database, use_embedder, tmp_path)
    twilio, telegram = FakeTwilio(), FakeTelegram()
    twilio_server, telegram_server = TestServer(twilio.app()), TestServer(telegram.app())
    await twilio_server.start_server()
    await telegram_server.start_server()
    settings = make_settings(
        twilio_account_sid=twilio.account_sid,
        twilio_auth_token=twilio.auth_token,
        twilio_whatsapp_from=WHATSAPP_FROM,
        twilio_api_base=str(twilio_server.make_url("")).rstrip("/"),
        telegram_bot_token=telegram.token,
        telegram_webhook_secret=TELEGRAM_SECRET,
        telegram_api_base=str(telegram_server.make_url("")).rstrip("/"),
        burst_window_seconds=0.1,
    )
    gateway = TestServer(create_app(settings, background=True))
    await gateway.start_server()
    try:
        yield Site(database, agent, gateway, twilio, telegram)
    finally:
        await gateway.close()
        await twilio_server.close()
        await telegram_server.close()


async def test_whatsapp_taken_over_stays_quiet_and_gets_the_staff_reply(site: Site) -> None:
    await site.whatsapp("How long can I return something?")
    await wait_until(lambda: _count(site.twilio.messages, 1))
    assert "30 days" in site.twilio.bodies[0]
    conversation = await site.conversation("whatsapp", VISITOR)

    await site.handoff.take_over(conversation, "anna@shop.example")
    await site.whatsapp("Hello? Is anyone there?")
    await wait_until(site.inbox_done)
    # The turn and its (absent) reply are written together: nothing was queued, nothing sent.
    assert await site.database.pool.fetchval("SELECT count(*) FROM outbox") == 1
    assert len(site.twilio.messages) == 1
    messages = await site.messages(conversation)
    assert messages[-2:] == [("system", "staff"), ("visitor", "Hello? Is anyone there?")]
    held = await site.database.pool.fetchval(
        "SELECT mode FROM turns WHERE conversation_id = $1 ORDER BY id DESC LIMIT 1", conversation
    )
    assert held == "staff"

    message_id = await site.handoff.reply(conversation, "Hi, Anna here. How can I help?", "anna")
    await wait_until(lambda: _count(site.twilio.messages, 2))
    staff = site.twilio.messages[1]
    assert (staff["to"], staff["body"]) == (VISITOR, "Hi, Anna here. How can I help?")

    # Twilio has the message before its answer (the sid) is written back to the outbox.
    async def recorded() -> bool:
        status = await site.database.pool.fetchval(
            "SELECT status FROM outbox WHERE message_id = $1", message_id
        )
        return status != "sending"

    await wait_until(recorded)
    row = await site.database.pool.fetchrow(
        "SELECT status, provider_message_id FROM outbox WHERE message_id = $1", message_id
    )
    assert (row["status"], row["provider_message_id"]) == ("sent", staff["sid"])
    author = await site.database.pool.fetchval(
        "SELECT author FROM messages WHERE id = $1 AND role = 'staff'", message_id
    )
    assert author == "anna"

    long_reply = "\n\n".join(f"Step {n}. " + "Pack the item in its original box. " * 12
                             for n in range(1, 6))  # fmt: skip
    assert len(long_reply) > 1600
    await site.handoff.reply(conversation, long_reply, "anna")
    await wait_until(lambda: _count(site.twilio.messages, 4))
    assert len(site.twilio.messages) == 4  # two parts, each within WhatsApp's limit
    assert site.twilio.bodies[2:] == split_message(long_reply.strip(), 1600)

    await site.handoff.hand_back(conversation)
    before = len(site.twilio.messages)
    await site.whatsapp("How long do refunds take?")
    await wait_until(lambda: _count(site.twilio.messages, before + 1))
    assert "5 working days" in site.twilio.bodies[-1]


async def test_telegram_taken_over_stays_quiet_and_gets_the_staff_reply(site: Site) -> None:
    await site.telegram_message("How long can I return something?")
    await wait_until(lambda: _count(site.telegram.messages, 1))
    conversation = await site.conversation("telegram", str(CHAT_ID))

    await site.handoff.take_over(conversation, "tom")
    typing = site.telegram.count("sendChatAction")
    assert typing >= 1  # shown while the bot made its answer
    await site.telegram_message("I want to return my boots")
    await wait_until(site.inbox_done)
    assert len(site.telegram.messages) == 1
    assert site.telegram.count("sendChatAction") == typing  # nobody is typing: staff have it
    assert (await site.messages(conversation))[-1] == ("visitor", "I want to return my boots")

    await site.handoff.reply(conversation, "Tom here: I'll send you a return label <today> & more.",
                             "tom")  # fmt: skip
    await wait_until(lambda: _count(site.telegram.messages, 2))
    sent = site.telegram.messages[1]
    assert sent["chat_id"] == CHAT_ID
    assert sent["text"] == "Tom here: I'll send you a return label <today> & more."

    await site.handoff.hand_back(conversation)
    await site.telegram_message("How long do refunds take?")
    await wait_until(lambda: _count(site.telegram.messages, 3))
    assert "5 working days" in site.telegram.messages[2]["text"]


async def test_staff_cannot_reach_a_json_api_conversation(site: Site) -> None:
    pool = site.database.pool
    conversation = await pool.fetchval(
        """INSERT INTO conversations (agent_id, channel, conversation_key)
           VALUES ($1, 'api', 'integration-1') RETURNING id""",
        site.agent.id,
    )
    with pytest.raises(InvalidInput):
        await site.handoff.take_over(conversation, "anna")
    with pytest.raises(InvalidInput):
        await site.handoff.reply(conversation, "Hello", "anna")
    assert await pool.fetchval("SELECT status FROM conversations WHERE id = $1", conversation) == (
        "bot"
    )


# -- the widget ---------------------------------------------------------------------------


@dataclass
class Listener:
    """A widget's live stream, read with a real SSE client in the background."""

    url: str
    params: dict[str, str]
    headers: dict[str, str] = field(default_factory=dict)
    events: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)
    status: int | None = None
    task: asyncio.Task[None] | None = None

    async def _read(self) -> None:
        async with (
            httpx.AsyncClient(base_url=self.url, timeout=60) as client,
            aconnect_sse(
                client,
                "GET",
                "/api/v1/agents/shop/conversations/events",
                params=self.params,
                headers=self.headers,
            ) as source,
        ):
            self.status = source.response.status_code
            if self.status != 200:
                await source.response.aread()
                return
            async for event in source.aiter_sse():
                if not event.data:
                    continue  # "retry:" alone; a browser dispatches no event for it either
                self.events.append((event.event, json.loads(event.data), event.id))

    def start(self) -> Listener:
        self.task = asyncio.create_task(self._read())
        return self

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def next(self, kind: str, count: int = 1, timeout: float = 5.0) -> dict[str, Any]:
        """The ``count``-th event of ``kind``; the timeout is far below the stream's re-read
        interval, so only a notification across processes can deliver it in time."""

        async def arrived() -> bool:
            assert self.task is not None
            if self.task.done():
                self.task.result()
                raise AssertionError(f"the stream ended (status {self.status})")
            return sum(1 for k, _, _ in self.events if k == kind) >= count

        await wait_until(arrived, timeout)
        return [d for k, d, _ in self.events if k == kind][count - 1]


@pytest.fixture
async def two_gateways(
    make_settings: MakeSettings, database: Database, use_embedder: UseEmbedder, tmp_path: Path
) -> AsyncIterator[tuple[str, TestServer, Agent]]:
    """Two gateway processes' worth of app on one database: the widget's and the staff's."""
    agent = await _shop(database, use_embedder, tmp_path)
    settings = make_settings()
    widget_side, staff_side = TestServer(create_app(settings)), TestServer(create_app(settings))
    await widget_side.start_server()
    await staff_side.start_server()
    try:
        yield str(widget_side.make_url("")).rstrip("/"), staff_side, agent
    finally:
        await widget_side.close()
        await staff_side.close()


async def test_a_live_widget_gets_staff_replies_sent_from_another_gateway(
    two_gateways: tuple[str, TestServer, Agent], database: Database
) -> None:
    url, staff_side, agent = two_gateways
    handoff = staff_side.app[HANDOFF]
    key = agent.widget_key
    first = await chat(url, "shop", "How long can I return something?", key=key, session_id=SESSION)
    assert "30 days" in first.data("done")["answer"]
    conversation = first.data("done")["conversation_id"]

    params = {"session_id": SESSION, "key": key, "since": "0"}
    listener = Listener(url, params, {"Origin": "https://shop.example"}).start()
    try:
        assert (await listener.next("state")) == {"status": "bot"}
        await handoff.take_over(conversation, "anna")
        assert (await listener.next("handoff"))["status"] == "staff"

        paused = await chat(url, "shop", "Hello, are you a person?", key=key, session_id=SESSION)
        done = paused.data("done")
        assert (done["mode"], done["answer"], done["handoff"]) == ("staff", "", "staff")
        assert paused.kinds()[-2:] == ["sources", "done"]
        assert "token" not in paused.kinds()

        reply_id = await handoff.reply(conversation, "Yes! Anna here, happy to help.", "anna")
        staff = await listener.next("staff")
        assert staff["text"] == "Yes! Anna here, happy to help."
        assert staff["id"] == reply_id
        assert listener.events[-1][2] == str(reply_id)  # the SSE id a reconnect resumes after
        assert "anna" not in json.dumps(staff)  # who is behind the reply stays with staff
    finally:
        await listener.stop()

    # Written while no stream was open: the reconnect (Last-Event-ID) brings it.
    missed = await handoff.reply(conversation, "Are you still there?", "anna")
    resumed = Listener(url, params, {"Last-Event-ID": str(reply_id)}).start()
    try:
        assert (await resumed.next("state")) == {"status": "staff"}
        assert (await resumed.next("staff"))["id"] == missed
        assert [d["id"] for k, d, _ in resumed.events if k == "staff"] == [missed]
        await handoff.hand_back(conversation)
        assert (await resumed.next("handoff"))["status"] == "bot"
    finally:
        await resumed.stop()

    again = await chat(url, "shop", "How long do refunds take?", key=key, session_id=SESSION)
    assert "5 working days" in again.data("done")["answer"]
    roles = await database.pool.fetch(
        "SELECT role FROM messages WHERE conversation_id = $1 ORDER BY id", conversation
    )
    assert [r["role"] for r in roles] == [
        "visitor", "assistant", "system", "visitor", "staff", "staff", "system",
        "visitor", "assistant",
    ]  # fmt: skip


async def test_the_widget_stream_checks_key_origin_and_session(
    two_gateways: tuple[str, TestServer, Agent],
) -> None:
    url, _, agent = two_gateways
    path = "/api/v1/agents/shop/conversations/events"
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        wrong = await client.get(path, params={"session_id": SESSION, "key": "pk_wrong"})
        assert wrong.status_code == 401
        foreign = await client.get(
            path,
            params={"session_id": SESSION, "key": agent.widget_key},
            headers={"Origin": "https://evil.example"},
        )
        assert foreign.status_code == 403
        bad = await client.get(path, params={"session_id": "x!", "key": agent.widget_key})
        assert bad.status_code == 400
        not_a_number = await client.get(
            path, params={"session_id": SESSION, "key": agent.widget_key, "since": "abc"}
        )
        assert not_a_number.status_code == 400


# -- a visitor asking for a person --------------------------------------------------------

MONDAY_MORNING = datetime(2024, 5, 6, 8, 0, tzinfo=UTC)  # 10:00 in Amsterdam
MONDAY_NIGHT = datetime(2024, 5, 6, 20, 0, tzinfo=UTC)  # 22:00 in Amsterdam


@dataclass
class Asker:
    database: Database
    cache: RedisCache
    use_embedder: UseEmbedder
    make_settings: MakeSettings

    async def ask(
        self, text: str, *, at: datetime, key: str, channel: str = "web"
    ) -> CollectingTurnOutput:
        output = CollectingTurnOutput()
        async with aiohttp.ClientSession() as session:
            pipeline = build_pipeline(
                self.make_settings(),
                self.database.pool,
                self.cache,
                self.use_embedder,
                session,
                None,
                clock=lambda: at,
            )
            request = TurnRequest(agent="shop", channel=channel, conversation_key=key, text=text)  # type: ignore[arg-type]
            await pipeline.run(request, output)
            await pipeline.memory.drain()
        return output

    async def status(self, key: str) -> str:
        found: str = await self.database.pool.fetchval(
            "SELECT status FROM conversations WHERE conversation_key = $1", key
        )
        return found


@pytest.fixture
async def asker(
    make_settings: MakeSettings,
    database: Database,
    cache: RedisCache,
    use_embedder: UseEmbedder,
    tmp_path: Path,
) -> Asker:
    await _shop(database, use_embedder, tmp_path)
    await Agents(database.pool).update(
        "shop",
        timezone="Europe/Amsterdam",
        settings={"business_hours": {"mon": "09:00-17:00", "tue": "09:00-17:00"}},
    )
    return Asker(database, cache, use_embedder, make_settings)


async def test_asking_for_a_person_waits_for_staff_with_the_handoff_text(asker: Asker) -> None:
    output = await asker.ask("Can I talk to a human?", at=MONDAY_MORNING, key="visitor-0001")
    done = output.done
    assert done is not None
    assert (done["mode"], done["answer"]) == ("handoff", DEFAULT_HANDOFF_TEXTS["en"])
    assert output.streamed_text == DEFAULT_HANDOFF_TEXTS["en"]
    assert await asker.status("visitor-0001") == "waiting_for_staff"

    # While the visitor waits, the bot keeps quiet; the message is kept for staff.
    waiting = await asker.ask("How long do refunds take?", at=MONDAY_MORNING, key="visitor-0001")
    assert waiting.done is not None
    assert (waiting.done["mode"], waiting.done["answer"]) == ("staff", "")
    assert waiting.done["handoff"] == "waiting_for_staff"
    assert waiting.streamed_text == ""
    rows = await asker.database.pool.fetch(
        """SELECT m.role, m.text FROM messages m JOIN conversations c ON c.id = m.conversation_id
            WHERE c.conversation_key = 'visitor-0001' ORDER BY m.id"""
    )
    assert [(r["role"], r["text"]) for r in rows] == [
        ("visitor", "Can I talk to a human?"),
        ("assistant", DEFAULT_HANDOFF_TEXTS["en"]),
        ("system", "waiting_for_staff"),
        ("visitor", "How long do refunds take?"),
    ]


async def test_outside_business_hours_the_visitor_gets_the_out_of_hours_text(
    asker: Asker,
) -> None:
    output = await asker.ask("Kan ik een medewerker spreken?", at=MONDAY_NIGHT, key="visitor-0002")
    assert output.done is not None
    assert output.done["answer"] == DEFAULT_OUT_OF_HOURS_TEXTS["nl"]
    assert await asker.status("visitor-0002") == "waiting_for_staff"

    await Agents(asker.database.pool).update(
        "shop",
        settings={
            "business_hours": {"mon": "09:00-17:00"},
            "out_of_hours_text": {"en": "We are closed; we reply tomorrow from 9."},
        },
    )
    own = await asker.ask("human please", at=MONDAY_NIGHT, key="visitor-0003")
    assert own.done is not None
    assert own.done["answer"] == "We are closed; we reply tomorrow from 9."


async def test_an_agent_without_handoff_answers_as_usual(asker: Asker) -> None:
    await Agents(asker.database.pool).update("shop", settings={"handoff_enabled": False})
    output = await asker.ask("Can I talk to a human?", at=MONDAY_MORNING, key="visitor-0004")
    assert output.done is not None
    assert output.done["mode"] != "handoff"
    assert await asker.status("visitor-0004") == "bot"


async def _count(items: list[Any], count: int) -> bool:
    return len(items) >= count


async def test_the_feed_listens_again_after_losing_its_connection(
    database: Database, use_embedder: UseEmbedder, tmp_path: Path
) -> None:
    agent = await _shop(database, use_embedder, tmp_path)
    conversation = await database.pool.fetchval(
        """INSERT INTO conversations (agent_id, channel, conversation_key)
           VALUES ($1, 'web', $2) RETURNING id""",
        agent.id,
        SESSION,
    )
    feed = ConversationFeed(database.pool, database.url, reconnect_delay=0.05)
    handoff = Handoff(database.pool)
    await feed.start()
    try:
        async with feed.follow(agent.id, "web", SESSION) as follower:
            await handoff.take_over(conversation, "anna")
            assert await follower.wait(5)
            killed = await database.pool.fetchval(
                """SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                    WHERE datname = current_database() AND query LIKE 'LISTEN%'"""
            )
            assert killed == 1

            async def listening() -> bool:
                return feed.listening

            await wait_until(listening, 10)
            await follower.wait(1)  # the wake-up that follows a reconnect
            await handoff.reply(conversation, "Still here", "anna")
            assert await follower.wait(5)
            seen = await feed.since(agent.id, "web", SESSION, 0)
            assert [(m.role, m.text) for m in seen] == [
                ("system", "staff"),
                ("staff", "Still here"),
            ]
    finally:
        await feed.close()
