"""WhatsApp webhooks from Meta's Cloud API on the real app: the handshake, signatures, inbox rows."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from core.inbound import MediaItem
from core.keyring import Keyring
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.retrieval.embedders import UseEmbedder
from core.store import Agent, Agents, Database
from core.store.inbox import Inbox
from core.store.knowledge import KnowledgeStore
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from tests.conftest import SECRETS_KEY, MakeSettings
from tests.fakes.meta import (
    FakeMeta,
    change,
    contact,
    encode,
    media_message,
    notification,
    signature,
    signed,
    status,
    text_message,
)
from tests.fakes.openai import FakeOpenAI

VERIFY_TOKEN = "meta-verify-token-0123456789"
CUSTOMER = "31612345678"
OTHER_CUSTOMER = "4915112345678"
WAMID = "wamid.HBgLMzE2MTIzNDU2NzgVAgASGBQzQUZBQjY4MEQ4QzE1QjE0NUY1RAA="


# -- webhooks ---------------------------------------------------------------------------------


@dataclass
class Answered:
    status: int
    content_type: str
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


@dataclass
class Gateway:
    url: str
    agent: Agent
    inbox: Inbox
    fake: FakeMeta

    async def get(self, **query: str) -> Answered:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{self.url}/webhooks/meta/shop", params=query) as response,
        ):
            return Answered(response.status, response.content_type, await response.text())

    async def post(self, body: bytes, headers: dict[str, str]) -> Answered:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{self.url}/webhooks/meta/shop", data=body, headers=headers) as response,
        ):
            return Answered(response.status, response.content_type, await response.text())

    async def deliver(self, payload: dict[str, Any]) -> Answered:
        """``payload`` encoded and signed as Meta does it."""
        body = encode(payload)
        return await self.post(body, signed(body, self.fake.app_secret))

    def change(self, **parts: Any) -> dict[str, Any]:
        return change(self.fake.phone_number_id, **parts)

    async def rows(self) -> list[Any]:
        return await self.inbox.rows(self.agent.id, "meta")


StartGateway = Callable[..., Awaitable[Gateway]]


@pytest.fixture
def fake() -> FakeMeta:
    return FakeMeta()


@pytest.fixture
async def start(
    make_settings: MakeSettings, database: Database, use_embedder: UseEmbedder, fake: FakeMeta
) -> AsyncIterator[StartGateway]:
    """Starts the app built by create_app with Meta's environment settings; agent 'shop'."""
    servers: list[TestServer] = []
    agents = Agents(database.pool, keyring=Keyring(SECRETS_KEY))
    agent = await agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))

    async def start_gateway(**overrides: Any) -> Gateway:
        values = {
            "meta_app_secret": fake.app_secret,
            "meta_verify_token": VERIFY_TOKEN,
            "meta_access_token": fake.access_token,
            "meta_phone_number_id": fake.phone_number_id,
        }
        server = TestServer(create_app(make_settings(**(values | overrides))))
        await server.start_server()
        servers.append(server)
        url = str(server.make_url("")).rstrip("/")
        return Gateway(url, agent, Inbox(database.pool), fake)

    yield start_gateway
    for server in servers:
        await server.close()


async def test_the_subscription_check_answers_the_challenge_only_for_the_verify_token(
    start: StartGateway, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = await start()
    caplog.set_level(logging.INFO)
    check = {"hub.mode": "subscribe", "hub.challenge": "1158201444"}
    answered = await gateway.get(**check, **{"hub.verify_token": VERIFY_TOKEN})
    assert (answered.status, answered.content_type) == (200, "text/plain")
    assert answered.text == "1158201444"
    for refused in (
        {**check, "hub.verify_token": VERIFY_TOKEN + "x"},
        {**check, "hub.verify_token": ""},
        check,
        {**check, "hub.mode": "unsubscribe", "hub.verify_token": VERIFY_TOKEN},
    ):
        answered = await gateway.get(**refused)
        assert answered.status == 403, refused
        assert answered.content_type == "application/json"
        assert answered.json()["error"]["code"] == "forbidden"
        assert "1158201444" not in answered.text
    # Ours, that is: the production access log (gateway/access_log.py) has no query strings.
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name != "aiohttp.access")
    assert "meta.verify.rejected agent=shop reason=wrong_token" in logged
    assert VERIFY_TOKEN not in logged


async def test_a_signed_message_is_stored_with_its_contact_name_and_answered_at_once(
    start: StartGateway,
) -> None:
    gateway = await start()
    message = text_message(WAMID, CUSTOMER, "Waar blijft mijn bestelling? Groetjes, José 👋")
    value = gateway.change(contacts=[contact(CUSTOMER, "José Müller")], messages=[message])
    answered = await gateway.deliver(notification([value]))
    assert (answered.status, answered.content_type, answered.json()) == (
        200,
        "application/json",
        {},
    )
    [row] = await gateway.rows()
    assert row.provider_message_id == WAMID
    assert row.conversation_key == CUSTOMER
    assert row.status == "pending"
    inbound = row.inbound
    assert inbound.customer_id == CUSTOMER
    assert inbound.text == "Waar blijft mijn bestelling? Groetjes, José 👋"
    assert inbound.display_name == "José Müller"
    assert inbound.media == ()
    # Staff see the message as Meta sent it, with its contact and the number it came to.
    assert dict(row.payload) == {
        "metadata": value["value"]["metadata"],
        "contacts": [contact(CUSTOMER, "José Müller")],
        "messages": [message],
    }


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "sha256=" + "0" * 64,
        "sha1=" + "0" * 40,
        "wrong-secret",  # a signature made with another app's secret
    ],
)
async def test_a_missing_or_wrong_signature_is_403_and_stores_nothing(
    start: StartGateway, header: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = await start()
    caplog.set_level(logging.INFO)
    body = encode(notification([gateway.change(messages=[text_message(WAMID, CUSTOMER, "Hi")])]))
    headers = {"Content-Type": "application/json"}
    if header == "wrong-secret":
        headers["X-Hub-Signature-256"] = signature(body, "another-apps-secret")
    elif header is not None:
        headers["X-Hub-Signature-256"] = header
    answered = await gateway.post(body, headers)
    assert answered.status == 403
    assert answered.json()["error"]["code"] == "forbidden"
    assert await gateway.inbox.count(gateway.agent.id, "meta") == 0
    [rejected] = [r for r in caplog.records if r.getMessage().startswith("meta.webhook.rejected")]
    assert "agent=shop" in rejected.getMessage()
    assert CUSTOMER not in caplog.text
    assert gateway.fake.app_secret not in caplog.text


async def test_the_signature_covers_the_bytes_as_sent_not_the_json_they_parse_to(
    start: StartGateway,
) -> None:
    """Meta escapes non-ASCII characters; the same JSON re-serialised as UTF-8 (as a receiver
    that re-encodes the parsed body would hash it) is other bytes, and refused."""
    gateway = await start()

    def payload(wamid: str) -> dict[str, Any]:
        message = text_message(wamid, CUSTOMER, "Où est ma commande ? 📦")
        return notification([gateway.change(messages=[message])])

    as_meta_sent, re_serialised = encode(payload(WAMID)), encode(payload(WAMID), ascii_only=False)
    assert b"\\u00f9" in as_meta_sent
    assert json.loads(as_meta_sent) == json.loads(re_serialised)
    assert as_meta_sent != re_serialised

    refused = await gateway.post(re_serialised, signed(as_meta_sent, gateway.fake.app_secret))
    assert refused.status == 403
    assert await gateway.rows() == []
    accepted = await gateway.post(as_meta_sent, signed(as_meta_sent, gateway.fake.app_secret))
    assert accepted.status == 200
    # UTF-8 as sent is accepted too, with the signature of its own bytes.
    utf8 = encode(payload("wamid.utf8"), ascii_only=False)
    assert (await gateway.post(utf8, signed(utf8, gateway.fake.app_secret))).status == 200
    rows = await gateway.rows()
    assert [r.provider_message_id for r in rows] == [WAMID, "wamid.utf8"]
    assert {r.inbound.text for r in rows} == {"Où est ma commande ? 📦"}


async def test_every_entry_change_and_message_is_stored_once(start: StartGateway) -> None:
    gateway = await start()
    first = text_message(WAMID, CUSTOMER, "Hello")
    voice = media_message(
        "wamid.second", OTHER_CUSTOMER, "audio", "1013859600285441", "audio/ogg; codecs=opus",
        voice=True,
    )  # fmt: skip
    photo = media_message(
        "wamid.third", CUSTOMER, "image", "2754859441498128", "image/jpeg", caption="This one?"
    )
    payload = notification(
        # Contacts in another order than the messages: matched by wa_id, not by position.
        [gateway.change(contacts=[contact(OTHER_CUSTOMER, "Lena"), contact(CUSTOMER, "Anna")],
                        messages=[first, voice])],
        [gateway.change(contacts=[contact(CUSTOMER, "Anna")], messages=[photo])],
    )  # fmt: skip
    assert (await gateway.deliver(payload)).status == 200
    assert (await gateway.deliver(payload)).status == 200  # Meta re-delivers: no new rows
    rows = await gateway.rows()
    assert [r.provider_message_id for r in rows] == [WAMID, "wamid.second", "wamid.third"]
    inbound = [r.inbound for r in rows]
    assert [(m.customer_id, m.display_name) for m in inbound] == [
        (CUSTOMER, "Anna"),
        (OTHER_CUSTOMER, "Lena"),
        (CUSTOMER, "Anna"),
    ]
    assert [m.text for m in inbound] == ["Hello", "", "This one?"]
    assert inbound[1].media == (MediaItem("audio", "1013859600285441", "audio/ogg; codecs=opus"),)
    assert inbound[2].media == (MediaItem("image", "2754859441498128", "image/jpeg"),)


async def test_reactions_other_kinds_and_other_numbers_are_acknowledged_not_stored(
    start: StartGateway, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = await start()
    caplog.set_level(logging.INFO)
    reaction = {
        "from": CUSTOMER, "id": "wamid.reaction", "timestamp": "1717000000", "type": "reaction",
        "reaction": {"message_id": WAMID, "emoji": "👍"},
    }  # fmt: skip
    system = {
        "from": CUSTOMER, "id": "wamid.system", "timestamp": "1717000000", "type": "system",
        "system": {"body": "User changed number", "type": "user_changed_number"},
    }  # fmt: skip
    elsewhere = change(
        "999000111222333", messages=[text_message("wamid.elsewhere", CUSTOMER, "Hi")]
    )
    payload = notification(
        [gateway.change(messages=[reaction, system]), elsewhere],
        [{"field": "account_update", "value": {"event": "VERIFIED_ACCOUNT"}}],
    )
    answered = await gateway.deliver(payload)
    assert (answered.status, answered.json()) == (200, {})
    assert await gateway.rows() == []
    ignored = [r.getMessage() for r in caplog.records if "meta.webhook.ignored" in r.getMessage()]
    assert any("type=reaction" in line for line in ignored)
    assert any("reason=other_number" in line for line in ignored)
    assert CUSTOMER not in caplog.text


async def test_delivery_reports_only_move_forward(start: StartGateway, database: Database) -> None:
    gateway = await start()
    await database.pool.execute(
        """INSERT INTO outbox (agent_id, channel, recipient, body, status, provider_message_id)
           VALUES ($1, 'meta', $2, 'Hello', 'sent', $3)""",
        gateway.agent.id,
        CUSTOMER,
        WAMID,
    )

    async def report(state: str, **extra: Any) -> None:
        value = gateway.change(statuses=[status(WAMID, state, CUSTOMER, **extra)])
        answered = await gateway.deliver(notification([value]))
        assert (answered.status, answered.json()) == (200, {})

    async def current() -> tuple[str, str | None]:
        row = await database.pool.fetchrow("SELECT status, error_code FROM outbox")
        return row["status"], row["error_code"]

    body = encode(notification([gateway.change(statuses=[status(WAMID, "read", CUSTOMER)])]))
    forged = await gateway.post(body, signed(body, "not-the-app-secret"))
    assert forged.status == 403
    assert await current() == ("sent", None)
    await report("delivered")
    assert await current() == ("delivered", None)
    await report("read")
    assert await current() == ("read", None)
    await report("delivered")  # late and out of order: ignored
    await report("failed", error_code=131026)
    assert await current() == ("read", None)


PAGES = [
    {"url": "/en/returns", "title": "Returns", "lang": "en",
     "text": "# Returns\nYou can return any item within 30 days. Refunds arrive within 5 working days."},
    {"url": "/en/faq", "title": "FAQ", "lang": "en",
     "text": "# FAQ\n## Returns\nHow long can I return something? You have 30 days to return an item."},
]  # fmt: skip


async def test_a_signed_message_is_answered_through_the_graph_api(
    make_settings: MakeSettings,
    database: Database,
    use_embedder: UseEmbedder,
    fake: FakeMeta,
    tmp_path: Path,
) -> None:
    """End to end in one process: Meta's webhook in, the worker answers, the reply goes out
    to the same customer through the Graph API, and its delivery report comes back."""
    agent = await Agents(database.pool).create("shop", embedder=EmbedderIdentity.of(use_embedder))
    path = tmp_path / "pages.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PAGES), encoding="utf-8")
    await Ingestor(KnowledgeStore(database.pool), use_embedder).ingest(
        agent, parse_source(str(path))
    )
    # A moment before the first token, so the customer sees "typing..." first.
    llm = FakeOpenAI(default_reply="You have 30 days to return an item [1].", first_token_delay=0.3)
    servers = [TestServer(llm.app()), TestServer(fake.app())]
    for server in servers:
        await server.start_server()
    settings = make_settings(
        llm_base_url=str(servers[0].make_url("/v1")),
        llm_api_key="sk-test",
        meta_app_secret=fake.app_secret,
        meta_verify_token=VERIFY_TOKEN,
        meta_access_token=fake.access_token,
        meta_phone_number_id=fake.phone_number_id,
        meta_api_base=str(servers[1].make_url("")).rstrip("/"),
        burst_window_seconds=0.0,
    )
    app = TestServer(create_app(settings, background=True))
    await app.start_server()
    servers.append(app)
    try:
        gateway = Gateway(str(app.make_url("")).rstrip("/"), agent, Inbox(database.pool), fake)
        question = text_message(WAMID, CUSTOMER, "How long can I return something?")
        value = gateway.change(contacts=[contact(CUSTOMER, "Sam")], messages=[question])
        answered = await gateway.deliver(notification([value]))
        assert (answered.status, answered.json()) == (200, {})

        for _ in range(300):  # the worker claims the row, asks the model, queues the reply
            if fake.messages:
                break
            await asyncio.sleep(0.05)
        [reply] = fake.messages
        assert reply["to"] == CUSTOMER
        assert reply["body"]["type"] == "text"
        assert "30 days" in reply["body"]["text"]["body"]
        assert fake.reads[0] == {"message_id": WAMID, "typing": {"type": "text"}}
        assert fake.unauthorized == []
        for _ in range(100):  # the outbox records the wamid Meta gave the reply
            sent = await database.pool.fetchrow("SELECT status, provider_message_id FROM outbox")
            if sent is not None and sent["status"] == "sent":
                break
            await asyncio.sleep(0.05)
        assert sent is not None
        assert (sent["status"], sent["provider_message_id"]) == ("sent", reply["id"])
        name = await database.pool.fetchval(
            "SELECT customer_name FROM conversations WHERE channel = 'meta' AND conversation_key = $1",
            CUSTOMER,
        )
        assert name == "Sam"

        report = gateway.change(statuses=[status(reply["id"], "delivered", CUSTOMER)])
        assert (await gateway.deliver(notification([report]))).status == 200
        assert await database.pool.fetchval("SELECT status FROM outbox") == "delivered"
    finally:
        for server in reversed(servers):
            await server.close()
