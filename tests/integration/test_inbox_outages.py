"""Outages behind the inbox: a model that fails, hangs or refuses for a while loses nothing.

The real pipeline answers with the real OpenAI client pointed at the local fake model, the
real outbox sender delivers to the local fake Twilio; only the settings are small, so that
back-off, time limits and the holding delay pass in fractions of a second.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import asyncpg
import pytest
from aiohttp.test_utils import TestServer

from channels.registry import BY_NAME
from channels.twilio import parse_message as twilio_message
from channels.twilio_send import TwilioSender
from core.answer.factory import build_pipeline
from core.answer.phrases import phrase
from core.answer.pipeline import AnswerPipeline
from core.cache import RedisCache
from core.jobs.inbox_worker import InboxWorker
from core.jobs.outbox_sender import OutboxSender
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.llm.openai_chat import OpenAIChatModel
from core.retrieval.embedders import UseEmbedder
from core.settings import Settings
from core.store import Agent, Agents, Database
from core.store.inbox import Backoff, Inbox
from core.store.knowledge import KnowledgeStore
from core.store.vector_index import EmbedderIdentity
from tests.fakes.openai import FakeOpenAI
from tests.fakes.twilio import FakeTwilio
from tests.integration.test_inbox_worker import Running
from tests.support.cli import run_parley
from tests.support.deliveries import add_delivery
from tests.support.services import free_port
from tests.support.waiting import wait_until

WHATSAPP_FROM = "whatsapp:+14155238886"
CUSTOMER = "whatsapp:+31612345678"
PAGES = [
    {"url": "https://shop.example/nl/verzending", "title": "Verzending", "lang": "nl",
     "text": "# Verzending\nBestellingen naar België komen binnen 2-3 werkdagen aan."},
]  # fmt: skip
ANSWER = "Bestellingen naar België komen binnen 2-3 werkdagen aan [1]."
HOLDING_NL = phrase("holding", "nl")


@dataclass
class Outage:
    """A shop whose model can be taken down and brought back, answering WhatsApp."""

    database: Database
    agent: Agent
    model: FakeOpenAI
    twilio: FakeTwilio
    pipeline: AnswerPipeline
    sender: TwilioSender
    inbox: Inbox
    model_port: int
    model_server: TestServer | None = None
    sid_counter: int = 0

    def worker(self, **options: Any) -> InboxWorker:
        values: dict[str, Any] = {
            "burst_window": 0.0,
            "lease": 5.0,
            "poll_interval": 0.05,
            "channels": BY_NAME,
            "memory": self.pipeline.memory,
            "backoff": Backoff(base=0.05, cap=0.2),
            "holding_after": 0.5,
        }
        return InboxWorker(self.database.pool, self.pipeline, **{**values, **options})

    def outbox_sender(self) -> OutboxSender:
        return OutboxSender(
            self.database.pool, {"whatsapp": self.sender}, poll_interval=0.05, base_backoff=0.05
        )

    async def start_model(self) -> None:
        if self.model_server is None:
            self.model_server = TestServer(self.model.app(), port=self.model_port)
            await self.model_server.start_server()

    async def write(self, body: str) -> None:
        self.sid_counter += 1
        sid = f"SM{self.sid_counter:032d}"
        payload = {"MessageSid": sid, "From": CUSTOMER, "To": WHATSAPP_FROM, "Body": body,
                   "NumMedia": "0"}  # fmt: skip
        assert await add_delivery(self.inbox, self.agent.id, "whatsapp", sid, CUSTOMER, payload)

    async def rows(self) -> list[dict[str, Any]]:
        found = await self.database.pool.fetch(
            "SELECT id, status, attempts, error, holding_sent_at FROM inbox ORDER BY id"
        )
        return [dict(r) for r in found]

    async def all_done(self) -> bool:
        rows = await self.rows()
        return bool(rows) and all(r["status"] == "done" for r in rows)

    async def outbox_settled(self) -> bool:
        statuses = await self.database.pool.fetch("SELECT status FROM outbox")
        return bool(statuses) and all(r["status"] in ("sent", "failed") for r in statuses)


@pytest.fixture
async def outage(
    settings: Settings,
    database: Database,
    use_embedder: UseEmbedder,
    cache: RedisCache,
    tmp_path: Path,
) -> AsyncIterator[Outage]:
    agents = Agents(database.pool)
    await agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    agent = await agents.update("shop", contact_route="hallo@shop.example")
    path = tmp_path / "pages.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PAGES), encoding="utf-8")
    await Ingestor(KnowledgeStore(database.pool), use_embedder).ingest(
        agent, parse_source(str(path))
    )
    twilio = FakeTwilio()
    twilio_server = TestServer(twilio.app())
    await twilio_server.start_server()
    sender = TwilioSender(
        twilio.account_sid,
        twilio.auth_token,
        WHATSAPP_FROM,
        api_base=str(twilio_server.make_url("")),
        timeout=5.0,
    )
    # The model lives on a port of its own, so that "refused" can be nothing listening there.
    port = free_port()
    chat = OpenAIChatModel(
        "gpt-test",
        api_key="sk-test",
        base_url=f"http://127.0.0.1:{port}/v1",
        queue_timeout=0.5,
        first_token_timeout=0.5,
        total_timeout=5.0,
        backoff=0.01,
    )
    model = FakeOpenAI(default_reply=ANSWER)
    async with aiohttp.ClientSession() as session:
        pipeline = build_pipeline(settings, database.pool, cache, use_embedder, session, chat)
        rig = Outage(database, agent, model, twilio, pipeline, sender, Inbox(database.pool), port)
        yield rig
        await pipeline.memory.drain()
        if rig.model_server is not None:
            await rig.model_server.close()
    await chat.close()
    await sender.close()
    await twilio_server.close()


@pytest.fixture
async def running() -> AsyncIterator[Running]:
    services = Running()
    yield services
    await services.stop()


@pytest.mark.parametrize("failure", ["status 500", "hang", "refused"])
async def test_a_model_outage_gets_one_holding_message_then_one_answer(
    outage: Outage, running: Running, failure: str
) -> None:
    if failure == "status 500":
        outage.model.chat_down_with = 500
        await outage.start_model()
    elif failure == "hang":
        outage.model.hang = True
        await outage.start_model()
    # "refused": nothing listens on the model's port until it is started below.

    await outage.write("Hoe lang duurt de levering naar België?")
    running.start(outage.worker().run())
    running.start(outage.outbox_sender().run())

    async def told_while_still_failing() -> bool:
        [row] = await outage.rows()
        return bool(outage.twilio.messages) and row["attempts"] >= 2

    await wait_until(told_while_still_failing)
    assert outage.twilio.bodies == [HOLDING_NL]
    # The customer writes again while waiting: the same turn, no second holding message.
    await outage.write("En naar Duitsland?")

    async def covered() -> bool:
        return all(r["holding_sent_at"] is not None for r in await outage.rows())

    await wait_until(covered)

    outage.model.chat_down_with = None
    outage.model.hang = False
    await outage.start_model()
    await wait_until(outage.all_done)
    await wait_until(outage.outbox_settled)
    bodies = outage.twilio.bodies
    assert len(bodies) == 2, bodies
    assert bodies[0] == HOLDING_NL
    assert bodies[1].startswith(ANSWER)
    assert "Bronnen:" in bodies[1]
    # Both messages were answered in one turn, stored once, whatever failed before.
    stored = await outage.database.pool.fetch("SELECT role, text FROM messages ORDER BY id")
    assert [(r["role"], r["text"]) for r in stored] == [
        ("visitor", "Hoe lang duurt de levering naar België?\nEn naar Duitsland?"),
        ("assistant", ANSWER),
    ]
    assert await outage.database.pool.fetchval("SELECT count(*) FROM outbox") == 2


async def test_a_message_failing_past_its_time_limit_fails_and_inbox_retry_takes_it_up(
    outage: Outage, running: Running, tmp_path: Path, database_url: str
) -> None:
    outage.model.chat_down_with = 503
    await outage.start_model()
    await outage.write("Hoe lang duurt de levering naar België?")
    worker = running.start(
        outage.worker(backoff=Backoff(base=0.05, cap=0.1, limit=0.3), holding_after=0).run()
    )

    async def failed() -> bool:
        return [r["status"] for r in await outage.rows()] == ["failed"]

    await wait_until(failed)
    [row] = await outage.rows()
    assert row["attempts"] >= 1
    assert row["error"] == "the answer could not be generated (llm_failed)"
    worker.cancel()

    listed = run_parley("inbox", "list", "--json", cwd=tmp_path, PARLEY_DATABASE_URL=database_url)
    assert listed.returncode == 0, listed.stderr
    [line] = [json.loads(x) for x in listed.stdout.splitlines()]
    assert (line["id"], line["status"], line["customer"]) == (row["id"], "failed", CUSTOMER)

    outage.model.chat_down_with = None
    retried = run_parley("inbox", "retry", cwd=tmp_path, PARLEY_DATABASE_URL=database_url)
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout.startswith("took up 1 message again")
    [row] = await outage.rows()
    assert (row["status"], row["attempts"]) == ("pending", 0)

    running.start(outage.worker(holding_after=0).run())
    running.start(outage.outbox_sender().run())
    await wait_until(outage.all_done)
    await wait_until(outage.outbox_settled)
    assert len(outage.twilio.bodies) == 1
    assert outage.twilio.bodies[0].startswith(ANSWER)

    again = run_parley("inbox", "retry", cwd=tmp_path, PARLEY_DATABASE_URL=database_url)
    assert again.stdout.strip() == "no failed messages to take up again"


async def test_a_message_no_retry_can_answer_fails_at_once(outage: Outage) -> None:
    await outage.start_model()
    # A chat id longer than any turn may carry: the message can never become a turn.
    odd = "whatsapp:+" + "3" * 300
    payload = {"MessageSid": "SM" + "9" * 32, "From": odd, "Body": "hello", "NumMedia": "0"}
    assert await add_delivery(
        outage.inbox, outage.agent.id, "whatsapp", "SM" + "9" * 32, odd, payload
    )
    worker = outage.worker()
    assert await worker.process_next()
    [row] = await outage.rows()
    assert (row["status"], row["attempts"]) == ("failed", 1)
    assert "conversation_key" in row["error"]
    assert not await worker.process_next()
    assert await worker.send_holding_messages() == 0  # failed messages are not waiting
    assert await outage.database.pool.fetchval("SELECT count(*) FROM outbox") == 0
    assert outage.model.chat_requests == []


@pytest.mark.parametrize("status", [400, 401, 403, 404])
async def test_a_request_the_model_refuses_fails_at_once(outage: Outage, status: int) -> None:
    outage.model.chat_down_with = status
    await outage.start_model()
    await outage.write("Hoe lang duurt de levering naar België?")
    worker = outage.worker()
    assert await worker.process_next()
    [row] = await outage.rows()
    assert (row["status"], row["attempts"]) == ("failed", 1)
    assert row["error"] == (
        f"the answer could not be generated (llm_failed: language model failed: status {status})"
    )
    assert len(outage.model.chat_requests) == 1  # neither the client nor the inbox tried again
    assert not await worker.process_next()


async def test_a_turn_backing_off_holds_back_its_conversation(outage: Outage) -> None:
    outage.model.chat_down_with = 500
    await outage.start_model()
    await outage.write("Hoe lang duurt de levering naar België?")
    worker = outage.worker(backoff=Backoff(base=60.0, cap=60.0))
    assert await worker.process_next()
    [row] = await outage.rows()
    assert (row["status"], row["attempts"]) == ("pending", 1)
    # A newer message of the same chat waits for the older one: never answered out of order.
    await outage.write("En naar Duitsland?")
    assert not await worker.process_next()
    # Staff (or `parley inbox retry`) cut the pause short; both are answered as one turn.
    outage.model.chat_down_with = None
    assert await outage.inbox.retry() == 1
    assert await worker.process_next()
    assert [r["status"] for r in await outage.rows()] == ["done", "done"]
    questions = [m["messages"][-1]["content"] for m in outage.model.turn_requests]
    assert "En naar Duitsland?" in questions[-1]


async def test_the_worker_outlives_a_database_outage(
    outage: Outage,
    running: Running,
    database_url: str,
    postgres_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await outage.start_model()
    name = urlsplit(database_url).path.lstrip("/")
    admin = await asyncpg.connect(postgres_url)
    # One connection of the test's own that the outage spares, to write while it lasts.
    spared = await asyncpg.connect(database_url)
    try:
        running.start(outage.worker(holding_after=0).run())
        await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        await admin.execute(
            """SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                WHERE datname = $1 AND pid <> $2""",
            name,
            spared.get_server_pid(),
        )
        payload = {"MessageSid": "SM1", "From": CUSTOMER, "Body": "Hoe lang duurt de levering "
                   "naar België?", "NumMedia": "0"}  # fmt: skip
        await spared.execute(
            """INSERT INTO inbox (agent_id, channel, provider_message_id, conversation_key,
                                  payload, message)
               VALUES ($1, 'whatsapp', 'SM1', $2, $3, $4)""",
            outage.agent.id,
            CUSTOMER,
            json.dumps(payload),
            json.dumps(twilio_message(payload, "SM1", CUSTOMER).to_json()),
        )

        async def worker_saw_the_outage() -> bool:
            return any("inbox.poll.failed" in r.getMessage() for r in caplog.records)

        await wait_until(worker_saw_the_outage)
    finally:
        await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        await admin.close()
        await spared.close()
    running.start(outage.outbox_sender().run())
    await wait_until(outage.all_done)
    await wait_until(outage.outbox_settled)
    [body] = outage.twilio.bodies
    assert body.startswith(ANSWER)
