"""The inbox worker end to end: inbox rows -> real pipeline -> outbox -> real senders -> fakes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from channels.delivery import split_message
from channels.registry import BY_NAME
from channels.telegram import store_update
from channels.telegram_send import TelegramSender
from channels.twilio_send import TwilioSender
from core.answer.phrases import phrase
from core.answer.pipeline import AnswerPipeline, PipelineConfig
from core.answer.rewrite import QueryRewriter
from core.cache import RedisCache
from core.jobs.inbox_worker import DEFAULT_WELCOME, InboxWorker
from core.jobs.outbox_sender import OutboxSender
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.memory import build_memory
from core.retrieval.embedders import UseEmbedder
from core.retrieval.retriever import build_retriever
from core.settings import Settings
from core.store import Agent, Agents, Database
from core.store.conversations import Conversations
from core.store.curated import CuratedAnswers
from core.store.inbox import Backoff, Inbox
from core.store.knowledge import KnowledgeStore
from core.store.outbox import Outbox
from core.store.vector_index import EmbedderIdentity
from tests.fakes.telegram import FakeTelegram
from tests.fakes.twilio import FakeTwilio
from tests.support.deliveries import add_delivery
from tests.support.waiting import wait_until

WHATSAPP_FROM = "whatsapp:+14155238886"
SITE = "https://shop.example"
ALICE = "whatsapp:+31612345678"
BOB = "whatsapp:+31687654321"
PAGES = [
    {"url": "/en/shipping", "title": "Shipping", "lang": "en",
     "text": "# Shipping\nOrders to Belgium arrive in 2-3 working days. Shipping costs 4.95 euro."},
    {"url": "/en/returns", "title": "Returns", "lang": "en",
     "text": "# Returns\nYou can return shoes within 30 days for a full refund."},
]  # fmt: skip
LONG_PARAGRAPH = "Our boots are made by hand in Portugal from full-grain leather. " * 12


@dataclass
class Rig:
    database: Database
    agent: Agent
    twilio: FakeTwilio
    telegram: FakeTelegram
    pipeline: AnswerPipeline
    senders: dict[str, Any]
    inbox: Inbox
    outbox: Outbox
    sid_counter: int = 0

    def worker(self, **options: Any) -> InboxWorker:
        values: dict[str, Any] = {
            "burst_window": 0.3,
            "lease": 5.0,
            "poll_interval": 0.05,
            "channels": BY_NAME,
            "memory": self.pipeline.memory,
        }
        return InboxWorker(self.database.pool, self.pipeline, **{**values, **options})

    def sender(self, **options: Any) -> OutboxSender:
        values: dict[str, Any] = {"poll_interval": 0.05, "base_backoff": 0.05}
        return OutboxSender(self.database.pool, self.senders, **{**values, **options})

    async def whatsapp(self, sender: str, body: str, *, media: bool = False) -> None:
        self.sid_counter += 1
        sid = f"SM{self.sid_counter:032d}"
        payload: dict[str, Any] = {
            "MessageSid": sid, "From": sender, "To": WHATSAPP_FROM, "Body": body,
            "NumMedia": "1" if media else "0",
        }  # fmt: skip
        if media:
            payload["MediaContentType0"] = "image/jpeg"
            payload["MediaUrl0"] = "https://api.twilio.com/media/ME1"
        assert await add_delivery(self.inbox, self.agent.id, "whatsapp", sid, sender, payload)

    async def telegram_message(self, chat_id: int, text: str, language: str = "en") -> None:
        self.sid_counter += 1
        update = {
            "update_id": 1000 + self.sid_counter,
            "message": {
                "message_id": self.sid_counter, "date": 1700000000, "text": text,
                "chat": {"id": chat_id, "type": "private", "first_name": "Ann"},
                "from": {"id": chat_id, "is_bot": False, "first_name": "Ann",
                         "language_code": language},
            },
        }  # fmt: skip
        assert await add_delivery(
            self.inbox, self.agent.id, "telegram", str(update["update_id"]), str(chat_id), update
        )

    async def statuses(self) -> list[str]:
        rows = await self.database.pool.fetch("SELECT status FROM inbox ORDER BY id")
        return [r["status"] for r in rows]

    async def all_done(self) -> bool:
        statuses = await self.statuses()
        return bool(statuses) and all(s == "done" for s in statuses)

    async def outbox_settled(self) -> bool:
        rows = await self.outbox.rows(self.agent.id)
        return bool(rows) and all(r.status in ("sent", "failed") for r in rows)


async def _shop(database: Database, embedder: UseEmbedder, tmp_path: Path) -> Agent:
    agents = Agents(database.pool)
    await agents.create("shop", embedder=EmbedderIdentity.of(embedder))
    agent = await agents.update("shop", contact_route="hello@shop.example", allowed_origins=[SITE])
    path = tmp_path / "pages.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PAGES), encoding="utf-8")
    await Ingestor(KnowledgeStore(database.pool), embedder).ingest(agent, parse_source(str(path)))
    return await agents.get("shop")


def make_pipeline(
    settings: Settings,
    database: Database,
    cache: RedisCache,
    embedder: UseEmbedder,
    session: aiohttp.ClientSession,
    pace_seconds: float = 0.0,
) -> AnswerPipeline:
    """Like `build_pipeline` without an LLM (extractive), with the pace under the test's control."""
    pool = database.pool
    return AnswerPipeline(
        agents=Agents(pool),
        conversations=Conversations(pool),
        memory=build_memory(settings, pool, cache, None),
        curated=CuratedAnswers(pool),
        retriever=build_retriever(settings, pool, embedder, cache, session),
        embedder=embedder,
        chat=None,
        rewriter=QueryRewriter(None, cache, model=None, timeout_ms=300),
        config=PipelineConfig(pace_seconds=pace_seconds),
    )


@pytest.fixture
async def rig(
    settings: Settings,
    database: Database,
    use_embedder: UseEmbedder,
    cache: RedisCache,
    tmp_path: Path,
) -> AsyncIterator[Rig]:
    agent = await _shop(database, use_embedder, tmp_path)
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
    async with aiohttp.ClientSession() as session:
        pipeline = make_pipeline(settings, database, cache, use_embedder, session)
        yield Rig(
            database,
            agent,
            twilio,
            telegram,
            pipeline,
            senders,
            Inbox(database.pool),
            Outbox(database.pool),
        )
        await pipeline.memory.drain()
    for sender in senders.values():
        await sender.close()
    await twilio_server.close()
    await telegram_server.close()


class Running:
    """Background services of a test, cancelled (and awaited) at the end."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, coroutine: Awaitable[None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coroutine)
        self.tasks.append(task)
        return task

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with pytest.raises(asyncio.CancelledError):
                await task


@pytest.fixture
async def running() -> AsyncIterator[Running]:
    services = Running()
    yield services
    await services.stop()


async def test_one_message_is_answered_delivered_and_stored(rig: Rig, running: Running) -> None:
    await rig.whatsapp(ALICE, "How long does delivery to Belgium take?")
    running.start(rig.worker().run())
    running.start(rig.sender().run())

    await wait_until(rig.all_done)
    await wait_until(rig.outbox_settled)
    [message] = rig.twilio.messages
    assert message["to"] == ALICE
    assert message["from"] == WHATSAPP_FROM
    assert "2-3 working days" in message["body"]
    [row] = await rig.outbox.rows(rig.agent.id)
    assert row.status == "sent"
    assert row.provider_message_id == message["sid"]
    assert row.conversation_id is not None
    assert row.message_id is not None

    conversations = Conversations(rig.database.pool)
    conversation = await conversations.find(rig.agent.id, "whatsapp", ALICE)
    assert conversation == row.conversation_id
    stored = await conversations.recent(conversation)
    # The answer is stored as written; the message adds the page it cites, as a link.
    answer, sources = message["body"].split("\n\nSources:\n")
    assert [(m.role, m.text) for m in stored] == [
        ("visitor", "How long does delivery to Belgium take?"),
        ("assistant", answer),
    ]
    assert "[1]" in answer
    assert "[2]" not in answer
    assert sources == "[1] Shipping – https://shop.example/en/shipping"


async def test_telegram_replies_link_the_pages_they_cite(rig: Rig, running: Running) -> None:
    await rig.telegram_message(601, "How long does delivery to Belgium take?")
    running.start(rig.worker(burst_window=0.0).run())
    running.start(rig.sender().run())

    await wait_until(rig.all_done)
    await wait_until(rig.outbox_settled)
    [message] = rig.telegram.messages
    assert message["parse_mode"] == "HTML"
    assert message["sent"].endswith(
        '\n\nSources:\n[1] <a href="https://shop.example/en/shipping">Shipping</a>'
    )
    shown, listed = message["text"].split("\n\nSources:\n")  # as the customer reads it
    assert "2-3 working days [1]" in shown
    assert listed == "[1] Shipping"


async def test_a_telegram_text_with_a_nul_is_acknowledged_and_answered(
    rig: Rig, running: Running
) -> None:
    update = {
        "update_id": 4242,
        "message": {
            "message_id": 7, "date": 1700000000,
            "text": "How long does delivery\u0000 to Belgium take?",
            "chat": {"id": 611, "type": "private", "first_name": "Ann"},
            "from": {"id": 611, "is_bot": False, "first_name": "Ann", "language_code": "en"},
        },
    }  # fmt: skip
    # What the webhook (and `parley telegram poll`) do with an Update before the 200.
    assert (await store_update(rig.inbox, rig.agent, update)).outcome == "stored"
    running.start(rig.worker(burst_window=0.0).run())
    running.start(rig.sender().run())

    await wait_until(rig.all_done)
    await wait_until(rig.outbox_settled)
    [message] = rig.telegram.messages
    assert "2-3 working days" in message["text"]


async def test_the_sources_are_listed_in_the_language_of_the_answer(
    rig: Rig, running: Running, use_embedder: UseEmbedder, tmp_path: Path
) -> None:
    page = {"url": "/nl/verzending", "title": "Verzending", "lang": "nl",
            "text": "# Verzending\nBestellingen naar België komen binnen 2-3 werkdagen aan."}  # fmt: skip
    path = tmp_path / "nl.jsonl"
    path.write_text(json.dumps(page), encoding="utf-8")
    await Ingestor(KnowledgeStore(rig.database.pool), use_embedder).ingest(
        rig.agent, parse_source(str(path))
    )
    await rig.whatsapp(ALICE, "Hoe lang duurt de levering naar België?")
    running.start(rig.worker(burst_window=0.0).run())
    running.start(rig.sender().run())

    await wait_until(rig.all_done)
    await wait_until(rig.outbox_settled)
    [message] = rig.twilio.messages
    answer, sources = message["body"].split("\n\nBronnen:\n")
    assert answer == "Bestellingen naar België komen binnen 2-3 werkdagen aan [1]."
    assert sources == "[1] Verzending – https://shop.example/nl/verzending"


async def test_a_burst_of_messages_gets_one_reply(rig: Rig, running: Running) -> None:
    for text in ("hi", "I want to send my shoes back", "how many days do I have to return them?"):
        await rig.whatsapp(ALICE, text)
    running.start(rig.worker(burst_window=0.5).run())
    running.start(rig.sender().run())

    await wait_until(rig.all_done)
    await wait_until(rig.outbox_settled)
    assert len(rig.twilio.messages) == 1
    assert "30 days" in rig.twilio.messages[0]["body"]
    turns = await rig.database.pool.fetch("SELECT query FROM turns")
    assert [t["query"] for t in turns] == [
        "hi\nI want to send my shoes back\nhow many days do I have to return them?"
    ]


async def test_the_burst_window_waits_for_the_visitor_to_stop_typing(rig: Rig) -> None:
    worker = rig.worker(burst_window=30.0)
    await rig.whatsapp(ALICE, "hi")
    assert not await worker.process_next()
    assert await rig.statuses() == ["pending"]


async def test_two_conversations_in_parallel_each_in_order(rig: Rig, running: Running) -> None:
    curated = CuratedAnswers(rig.database.pool)
    long_answer = "\n\n".join(f"Part {n}. {LONG_PARAGRAPH}" for n in range(1, 7))
    await curated.create(rig.agent.id, long_answer, keywords=("boots",))
    await rig.whatsapp(ALICE, "Tell me about your boots")
    await rig.whatsapp(BOB, "What are the boots made of?")
    running.start(rig.worker().run())
    await wait_until(rig.all_done)
    # both replies are queued: the sender sends them side by side, each chat's parts in order
    running.start(rig.sender().run())
    await wait_until(rig.outbox_settled)
    expected = split_message(long_answer, TwilioSender.limit)
    assert len(expected) > 2
    for recipient in (ALICE, BOB):
        bodies = [m["body"] for m in rig.twilio.messages if m["to"] == recipient]
        assert bodies == expected
    # Both chats were served side by side, not one after the other.
    recipients = [m["to"] for m in rig.twilio.messages]
    first_bob = recipients.index(BOB)
    assert ALICE in recipients[first_bob:]


async def test_a_long_reply_goes_out_in_ordered_parts_within_the_limit(
    rig: Rig, running: Running
) -> None:
    curated = CuratedAnswers(rig.database.pool)
    paragraphs = [f"Section {n}. {LONG_PARAGRAPH}" for n in range(1, 100)]
    long_answer = "\n\n".join(paragraphs)[:10_000].rstrip()
    assert len(long_answer) == 10_000
    await curated.create(rig.agent.id, long_answer, keywords=("catalogue",))
    await rig.whatsapp(ALICE, "Send me the catalogue")
    running.start(rig.worker().run())
    running.start(rig.sender().run())

    await wait_until(rig.all_done)
    await wait_until(rig.outbox_settled)
    bodies = rig.twilio.bodies
    assert len(bodies) >= 7
    assert all(len(b) <= 1600 for b in bodies)
    assert bodies == split_message(long_answer, 1600)
    rows = await rig.outbox.rows(rig.agent.id)
    assert [r.part for r in rows] == list(range(len(bodies)))


async def test_a_worker_stopped_mid_turn_gives_its_messages_back_at_once(
    rig: Rig, running: Running, settings: Settings, cache: RedisCache, use_embedder: UseEmbedder
) -> None:
    curated = CuratedAnswers(rig.database.pool)
    answer = "We ship to Belgium, the Netherlands and Germany. " * 10
    await curated.create(rig.agent.id, answer.strip(), keywords=("ship",))
    await rig.whatsapp(ALICE, "Where do you ship?")
    async with aiohttp.ClientSession() as session:
        slow = make_pipeline(settings, rig.database, cache, use_embedder, session, pace_seconds=0.1)
        # A lease far longer than the test: the next worker must not have to wait for it.
        doomed = InboxWorker(
            rig.database.pool, slow, burst_window=0.1, lease=600.0, poll_interval=0.05
        )
        first = asyncio.create_task(doomed.run())

        async def processing() -> bool:
            return await rig.statuses() == ["processing"]

        await wait_until(processing)
        await asyncio.sleep(0.2)  # into the turn, which takes ~3 s at this pace
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
    assert await rig.statuses() == ["pending"]
    assert await rig.outbox.rows(rig.agent.id) == []

    running.start(rig.worker(lease=600.0).run())
    running.start(rig.sender().run())
    await wait_until(rig.all_done)
    await wait_until(rig.outbox_settled)
    assert rig.twilio.bodies == [answer.strip()]
    assert len(await rig.outbox.rows(rig.agent.id)) == 1


async def test_a_stopping_worker_finishes_its_turns_within_the_grace_and_claims_no_more(
    rig: Rig, running: Running, settings: Settings, cache: RedisCache, use_embedder: UseEmbedder
) -> None:
    curated = CuratedAnswers(rig.database.pool)
    answer = "We ship to Belgium, the Netherlands and Germany. " * 10
    await curated.create(rig.agent.id, answer.strip(), keywords=("ship",))
    await rig.whatsapp(ALICE, "Where do you ship?")
    async with aiohttp.ClientSession() as session:
        slow = make_pipeline(settings, rig.database, cache, use_embedder, session, pace_seconds=0.1)
        stopping = InboxWorker(
            rig.database.pool, slow, burst_window=0.1, lease=600.0, poll_interval=0.05,
            grace=30.0, channels=BY_NAME,
        )  # fmt: skip
        task = asyncio.create_task(stopping.run())

        async def processing() -> bool:
            return await rig.statuses() == ["processing"]

        await wait_until(processing)
        # Alice's turn takes ~3 s at this pace; Bob writes as the worker is told to stop.
        await rig.whatsapp(BOB, "Where do you ship?")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    # Alice's turn ran to its end and her reply is queued; Bob's message waits for a worker.
    assert await rig.statuses() == ["done", "pending"]
    [queued] = await rig.outbox.rows(rig.agent.id)
    assert (queued.recipient, queued.body) == (ALICE, answer.strip())


async def test_media_only_gets_the_text_only_reply(rig: Rig, running: Running) -> None:
    await rig.whatsapp(ALICE, "", media=True)
    running.start(rig.worker().run())
    running.start(rig.sender().run())

    await wait_until(rig.all_done)
    await wait_until(rig.outbox_settled)
    assert rig.twilio.bodies == [phrase("text_only", "en")]


async def test_telegram_start_gets_the_welcome_and_questions_an_answer(
    rig: Rig, running: Running
) -> None:
    await Agents(rig.database.pool).update(
        "shop", settings={"welcome_text": "Welcome to the shop! Ask away."}
    )
    await rig.telegram_message(501, "/start")
    worker = rig.worker(burst_window=0.0)
    assert await worker.process_next()
    await rig.telegram_message(502, "/start")
    await Agents(rig.database.pool).update("shop", settings={})
    assert await worker.process_next()
    await rig.telegram_message(501, "How long does delivery to Belgium take?")
    assert await worker.process_next()
    running.start(rig.sender().run())

    await wait_until(rig.all_done)
    await wait_until(rig.outbox_settled)
    by_chat = {
        chat: [m["text"] for m in rig.telegram.messages if m["chat_id"] == chat]
        for chat in (501, 502)
    }
    assert by_chat[502] == [DEFAULT_WELCOME]
    assert by_chat[501][0] == "Welcome to the shop! Ask away."
    assert "2-3 working days" in by_chat[501][1]


async def test_an_unexpected_error_is_retried_then_given_up(rig: Rig) -> None:
    class Broken:
        async def run(self, request: object, output: object) -> object:
            raise RuntimeError("llm_failed")

    await rig.whatsapp(ALICE, "hello?")
    worker = InboxWorker(
        rig.database.pool,
        Broken(),  # type: ignore[arg-type]
        burst_window=0.0,
        backoff=Backoff(base=0.0),  # tried again at once
    )
    for attempt in (1, 2):
        assert await worker.process_next()
        row = await rig.database.pool.fetchrow("SELECT status, attempts, error FROM inbox")
        assert row is not None
        assert (row["status"], row["attempts"], row["error"]) == ("pending", attempt, "llm_failed")
    assert await worker.process_next()
    row = await rig.database.pool.fetchrow("SELECT status, attempts FROM inbox")
    assert row is not None
    assert (row["status"], row["attempts"]) == ("failed", 3)
    assert not await worker.process_next()
    assert await rig.outbox.rows(rig.agent.id) == []


async def test_telegram_shows_typing_while_the_answer_is_made(rig: Rig) -> None:
    existing = rig.senders["telegram"]
    # Typing repeats every 50 ms here, so a loop left running would show within the wait below.
    telegram = TelegramSender(
        rig.telegram.token, api_base=existing._api_base, timeout=5.0, typing_interval=0.05
    )
    await rig.telegram_message(777, "How long does delivery to Belgium take?")
    worker = rig.worker(burst_window=0.0, senders={"telegram": telegram})
    assert await worker.process_next()
    actions = [c for c in rig.telegram.calls if c["method"] == "sendChatAction"]
    assert actions  # shown while the turn ran
    assert str(actions[0]["params"]["chat_id"]) == "777"
    assert actions[0]["params"]["action"] == "typing"
    # ... and stopped with the turn: no more typing once it is answered.
    count = len(actions)
    await asyncio.sleep(0.3)
    assert len([c for c in rig.telegram.calls if c["method"] == "sendChatAction"]) == count
    await telegram.close()


async def test_a_newer_message_during_the_reply_redoes_the_turn_with_both(rig: Rig) -> None:
    class Gated:
        """The real pipeline, held at its start until the test has sent a newer message."""

        def __init__(self, pipeline: AnswerPipeline) -> None:
            self.pipeline = pipeline
            self.started = asyncio.Event()
            self.release = asyncio.Event()

        async def run(self, request: Any, output: Any) -> Any:
            self.started.set()
            await self.release.wait()
            return await self.pipeline.run(request, output)

    gated = Gated(rig.pipeline)
    worker = InboxWorker(rig.database.pool, gated, burst_window=0.0, lease=5.0)  # type: ignore[arg-type]
    await rig.whatsapp(ALICE, "I ordered boots last week")
    turn = asyncio.create_task(worker.process_next())
    await asyncio.wait_for(gated.started.wait(), timeout=10)
    await rig.whatsapp(ALICE, "How long does delivery to Belgium take?")
    gated.release.set()
    assert await turn  # it ran, and let its reply go
    assert await rig.database.pool.fetchval("SELECT count(*) FROM outbox") == 0
    assert await rig.database.pool.fetchval("SELECT count(*) FROM messages") == 0

    gated.started.clear()
    assert await worker.process_next()
    bodies = await rig.database.pool.fetch("SELECT body FROM outbox")
    assert len(bodies) == 1
    [question] = await rig.database.pool.fetch("SELECT text FROM messages WHERE role = 'visitor'")
    assert question["text"] == "I ordered boots last week\nHow long does delivery to Belgium take?"
    assert await rig.database.pool.fetchval("SELECT count(*) FROM inbox WHERE status = 'done'") == 2
