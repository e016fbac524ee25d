"""WhatsApp end to end in one gateway process: signed webhook in, the answer out via Twilio."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer
from twilio.request_validator import RequestValidator

from core.jobs.outbox_sender import OutboxSender
from core.keyring import Keyring
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.retrieval.embedders import UseEmbedder
from core.store import Agents, Database
from core.store.knowledge import KnowledgeStore
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from gateway.senders import AgentSenders
from tests.conftest import SECRETS_KEY, MakeSettings
from tests.fakes.openai import FakeOpenAI
from tests.fakes.twilio import FakeTwilio

VISITOR = "whatsapp:+31612345678"
PAGES = [
    {"url": "/en/returns", "title": "Returns", "lang": "en",
     "text": "# Returns\nYou can return any item within 30 days. Refunds arrive within 5 working days."},
    {"url": "/en/faq", "title": "FAQ", "lang": "en",
     "text": "# FAQ\n## Returns\nHow long can I return something? You have 30 days to return an item."},
]  # fmt: skip


async def test_a_whatsapp_message_is_answered_through_twilio(
    make_settings: MakeSettings, database: Database, use_embedder: UseEmbedder, tmp_path: Path
) -> None:
    agents = Agents(database.pool)
    await agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    agent = await agents.update("shop", allowed_origins=["https://shop.example"])
    path = tmp_path / "pages.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PAGES), encoding="utf-8")
    await Ingestor(KnowledgeStore(database.pool), use_embedder).ingest(
        agent, parse_source(str(path))
    )

    fake = FakeTwilio()
    twilio = TestServer(fake.app())
    await twilio.start_server()
    settings = make_settings(
        twilio_account_sid=fake.account_sid,
        twilio_auth_token=fake.auth_token,
        twilio_whatsapp_from="whatsapp:+14155238886",
        twilio_api_base=str(twilio.make_url("")).rstrip("/"),
    )
    gateway = TestServer(create_app(settings, background=True))
    await gateway.start_server()
    try:
        url = str(gateway.make_url("/webhooks/twilio/shop"))
        fields = {
            "MessageSid": "SM" + "1" * 32, "AccountSid": fake.account_sid, "From": VISITOR,
            "To": "whatsapp:+14155238886", "Body": "How long can I return something?",
            "NumMedia": "0", "ProfileName": "Sam",
        }  # fmt: skip
        signature = RequestValidator(fake.auth_token).compute_signature(url, fields)
        started = time.monotonic()
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=fields, headers={"X-Twilio-Signature": signature}) as response,
        ):
            assert response.status == 200
            assert response.content_type == "text/xml"
        acknowledged = time.monotonic() - started
        assert acknowledged < 1.0  # the webhook never waits for the answer

        for _ in range(300):  # the worker waits out the burst window, then answers
            if fake.messages:
                break
            await asyncio.sleep(0.05)
        [message] = fake.messages
        assert message["to"] == VISITOR
        assert "30 days" in message["body"]
        stored = await database.pool.fetch(
            "SELECT m.role, m.text FROM messages m JOIN conversations c ON c.id = m.conversation_id "
            "WHERE c.channel = 'whatsapp' AND c.conversation_key = $1 ORDER BY m.id",
            VISITOR,
        )
        assert [r["role"] for r in stored] == ["visitor", "assistant"]
        # The message ends with the pages the answer cites, numbered as it cites them.
        answer, listed = message["body"].split("\n\nSources:\n")
        assert answer == stored[1]["text"]
        cited = sorted({int(n) for n in re.findall(r"\[(\d+)\]", answer)})
        assert cited == list(range(1, len(cited) + 1))
        trace = await database.pool.fetchval("SELECT trace FROM turns")
        prompt = {s["id"]: s for s in trace["sources"]}
        pages = [prompt[trace["cited_sources"][str(n)]] for n in cited]
        assert listed.split("\n") == [
            f"[{n}] {page['title']} – https://shop.example{page['url']}"
            for n, page in zip(cited, pages, strict=True)
        ]
        assert await database.pool.fetchval("SELECT status FROM inbox") == "done"
        sent = await database.pool.fetchrow("SELECT status, provider_message_id FROM outbox")
        assert sent["status"] == "sent"
        assert sent["provider_message_id"] == message["sid"]
    finally:
        await gateway.close()
        await twilio.close()


async def test_delivery_reports_only_move_forward(
    make_settings: MakeSettings, database: Database, use_embedder: UseEmbedder
) -> None:
    agent = await Agents(database.pool).create("shop", embedder=EmbedderIdentity.of(use_embedder))
    await database.pool.execute(
        """INSERT INTO outbox (agent_id, channel, recipient, body, status, provider_message_id)
           VALUES ($1, 'whatsapp', $2, 'Hello', 'sent', 'SM42')""",
        agent.id,
        VISITOR,
    )
    token = "status-token-1"
    gateway = TestServer(create_app(make_settings(twilio_auth_token=token)))
    await gateway.start_server()
    url = str(gateway.make_url("/webhooks/twilio/status"))

    async def report(status: str, *, signed: bool = True, **extra: str) -> int:
        fields = {"MessageSid": "SM42", "MessageStatus": status, **extra}
        signature = RequestValidator(token if signed else "wrong").compute_signature(url, fields)
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=fields, headers={"X-Twilio-Signature": signature}) as response,
        ):
            return response.status

    async def status() -> str:
        value: str = await database.pool.fetchval("SELECT status FROM outbox")
        return value

    try:
        assert await report("read", signed=False) == 403
        assert await status() == "sent"
        assert await report("delivered") == 200
        assert await status() == "delivered"
        assert await report("sent") == 200  # late and out of order: ignored
        assert await status() == "delivered"
        assert await report("read") == 200
        assert await report("failed", ErrorCode="30008") == 200  # read is final
        assert await status() == "read"
    finally:
        await gateway.close()


async def test_each_agent_sends_with_its_own_twilio_account(
    make_settings: MakeSettings, database: Database, use_embedder: UseEmbedder
) -> None:
    fake = FakeTwilio()
    twilio = TestServer(fake.app())
    await twilio.start_server()
    agents = Agents(database.pool, keyring=Keyring(SECRETS_KEY))
    identity = EmbedderIdentity.of(use_embedder)
    own = await agents.create("own", embedder=identity)  # the fake's account, in the database
    await agents.update(
        "own",
        settings={"twilio": {"account_sid": fake.account_sid, "auth_token": fake.auth_token,
                             "whatsapp_from": "whatsapp:+14155238886"}},
    )  # fmt: skip
    other = await agents.create("other", embedder=identity)  # another account, in the database
    await agents.update(
        "other",
        settings={"twilio": {"account_sid": "AC" + "9" * 32, "auth_token": "not-the-fake",
                             "whatsapp_from": "whatsapp:+14155230000"}},
    )  # fmt: skip
    plain = await agents.create("plain", embedder=identity)  # nothing of its own: environment
    for agent in (own, other, plain):
        await database.pool.execute(
            "INSERT INTO outbox (agent_id, channel, recipient, body) VALUES ($1, 'whatsapp', $2, $3)",
            agent.id,
            VISITOR,
            f"Hello from {agent.slug}",
        )
    settings = make_settings(  # the environment's account is wrong on purpose
        twilio_account_sid="AC" + "1" * 32,
        twilio_auth_token="wrong-env-token",
        twilio_whatsapp_from="whatsapp:+10000000000",
        twilio_api_base=str(twilio.make_url("")).rstrip("/"),
    )
    senders = AgentSenders(settings, agents)
    try:
        outbox = OutboxSender(database.pool, senders, base_backoff=0.01)
        for _ in range(3):  # one chat: its parts go out one after another
            await outbox.send_due()
    finally:
        await senders.close()
        await twilio.close()
    assert fake.bodies == ["Hello from own"]
    rows = await database.pool.fetch(
        "SELECT a.slug, o.status, o.error_code FROM outbox o JOIN agents a ON a.id = o.agent_id"
    )
    outcome = {r["slug"]: (r["status"], r["error_code"]) for r in rows}
    assert outcome["own"] == ("sent", None)
    assert outcome["other"][0] == "failed"  # Twilio refused that account: recorded, not retried
    assert outcome["plain"][0] == "failed"


async def _signed_post(url: str, auth_token: str, fields: dict[str, str]) -> tuple[int, float]:
    """POST a webhook signed the way Twilio signs it; the status and the seconds it took."""
    signature = RequestValidator(auth_token).compute_signature(url, fields)
    started = time.monotonic()
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=fields, headers={"X-Twilio-Signature": signature}) as response,
    ):
        await response.read()
        return response.status, time.monotonic() - started


async def test_webhooks_are_acknowledged_at_once_while_the_model_takes_30_seconds(
    make_settings: MakeSettings, database: Database, use_embedder: UseEmbedder, tmp_path: Path
) -> None:
    agent = await Agents(database.pool).create("shop", embedder=EmbedderIdentity.of(use_embedder))
    path = tmp_path / "pages.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PAGES), encoding="utf-8")
    await Ingestor(KnowledgeStore(database.pool), use_embedder).ingest(
        agent, parse_source(str(path))
    )
    llm = FakeOpenAI(first_token_delay=30.0)
    llm_server = TestServer(llm.app())
    await llm_server.start_server()
    fake = FakeTwilio()
    twilio = TestServer(fake.app())
    await twilio.start_server()
    settings = make_settings(
        llm_base_url=str(llm_server.make_url("/v1")),
        llm_api_key="sk-test",
        twilio_account_sid=fake.account_sid,
        twilio_auth_token=fake.auth_token,
        twilio_whatsapp_from="whatsapp:+14155238886",
        twilio_api_base=str(twilio.make_url("")).rstrip("/"),
        burst_window_seconds=0.0,
    )
    gateway = TestServer(create_app(settings, background=True))
    await gateway.start_server()
    url = str(gateway.make_url("/webhooks/twilio/shop"))

    def message(number: int, sender: str) -> dict[str, str]:
        return {"MessageSid": f"SM{number:032d}", "AccountSid": fake.account_sid, "From": sender,
                "To": "whatsapp:+14155238886", "Body": "How long can I return something?",
                "NumMedia": "0"}  # fmt: skip

    try:
        status, first = await _signed_post(url, fake.auth_token, message(1, VISITOR))
        assert status == 200
        for _ in range(200):  # the worker has claimed the message and is waiting on the model
            if llm.streams_started:
                break
            await asyncio.sleep(0.05)
        assert llm.streams_started == 1
        timings = [first]
        for number in range(2, 12):  # other customers write while that answer is generated
            status, took = await _signed_post(
                url, fake.auth_token, message(number, f"whatsapp:+3161234{number:04d}")
            )
            assert status == 200
            timings.append(took)
        assert max(timings) < 1.0, timings
        assert await database.pool.fetchval("SELECT count(*) FROM inbox") == 11
        assert fake.messages == []  # nothing was answered yet: the model is still thinking
    finally:
        await gateway.close()
        await twilio.close()
        await llm_server.close()
