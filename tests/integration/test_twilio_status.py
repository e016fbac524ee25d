"""Twilio delivery reports on the real app: a report changes only the messages of the agent
whose credentials signed it, and every reply asks for its reports at its agent's address."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from twilio.request_validator import RequestValidator

from core.jobs.outbox_sender import OutboxSender
from core.keyring import Keyring
from core.retrieval.embedders import UseEmbedder
from core.store import Agents, Database
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from gateway.senders import AgentSenders
from tests.conftest import SECRETS_KEY, MakeSettings
from tests.fakes.twilio import FakeTwilio

ENV_TOKEN = "env-auth-token-0123456789abcdef"
SHOP_TOKEN = "shop-auth-token-fedcba9876543210"
CAFE_TOKEN = "cafe-auth-token-5555aaaa5555aaaa"
VISITOR = "whatsapp:+31612345678"
WHATSAPP_FROM = "whatsapp:+14155238886"
PUBLIC_URL = "https://bot.example.com"
SENT = {"shop": "SM" + "a" * 32, "cafe": "SM" + "c" * 32, "plain": "SM" + "e" * 32}


def _account(sid: str, token: str) -> dict[str, dict[str, str]]:
    return {"twilio": {"account_sid": sid, "auth_token": token, "whatsapp_from": WHATSAPP_FROM}}


async def _post_report(
    base: str, query: str, sid: str, status: str, *, token: str, signed_for: str = ""
) -> int:
    """A delivery report as Twilio posts it to ``/webhooks/twilio/status{query}``."""
    path = "/webhooks/twilio/status" + query
    fields = {
        "MessageSid": sid,
        "SmsSid": sid,
        "MessageStatus": status,
        "SmsStatus": status,
        "AccountSid": "AC" + "0" * 32,
        "To": VISITOR,
        "From": WHATSAPP_FROM,
        "ApiVersion": "2010-04-01",
    }
    signature = RequestValidator(token).compute_signature((signed_for or base) + path, fields)
    async with (
        aiohttp.ClientSession() as session,
        session.post(base + path, data=fields, headers={"X-Twilio-Signature": signature}) as answer,
    ):
        await answer.read()
        return answer.status


@dataclass
class Gateway:
    url: str
    database: Database

    async def report(self, sid: str, status: str, *, token: str, agent: str | None) -> int:
        query = f"?agent={agent}" if agent is not None else ""
        return await _post_report(self.url, query, sid, status, token=token)

    async def statuses(self) -> dict[str, str]:
        rows = await self.database.pool.fetch(
            "SELECT a.slug, o.status FROM outbox o JOIN agents a ON a.id = o.agent_id"
        )
        return {r["slug"]: r["status"] for r in rows}


@pytest.fixture
async def gateway(
    make_settings: MakeSettings, database: Database, use_embedder: UseEmbedder
) -> AsyncIterator[Gateway]:
    """Agents 'shop' and 'cafe' with Twilio accounts of their own, 'plain' with the
    environment's; each has sent one message, now 'sent'."""
    agents = Agents(database.pool, keyring=Keyring(SECRETS_KEY))
    identity = EmbedderIdentity.of(use_embedder)
    for slug in SENT:
        agent = await agents.create(slug, embedder=identity)
        await database.pool.execute(
            """INSERT INTO outbox (agent_id, channel, recipient, body, status, provider_message_id)
               VALUES ($1, 'whatsapp', $2, $3, 'sent', $4)""",
            agent.id,
            VISITOR,
            f"Hello from {slug}",
            SENT[slug],
        )
    await agents.update("shop", settings=_account("AC" + "1" * 32, SHOP_TOKEN))
    await agents.update("cafe", settings=_account("AC" + "2" * 32, CAFE_TOKEN))
    server = TestServer(create_app(make_settings(twilio_auth_token=ENV_TOKEN)))
    await server.start_server()
    yield Gateway(str(server.make_url("")).rstrip("/"), database)
    await server.close()


async def test_a_report_changes_only_the_messages_of_the_agent_whose_credentials_signed_it(
    gateway: Gateway,
) -> None:
    untouched = {"shop": "sent", "cafe": "sent", "plain": "sent"}
    # Shop's account reports on cafe's message: acknowledged (Twilio must not retry it),
    # and nothing changes.
    assert await gateway.report(SENT["cafe"], "failed", token=SHOP_TOKEN, agent="shop") == 200
    assert await gateway.statuses() == untouched
    # The environment's account, on a callback naming no agent, reaches only the agents
    # that send with it.
    assert await gateway.report(SENT["cafe"], "read", token=ENV_TOKEN, agent=None) == 200
    assert await gateway.report(SENT["shop"], "undelivered", token=ENV_TOKEN, agent=None) == 200
    assert await gateway.statuses() == untouched
    # Naming an agent that uses the environment's account reaches only that agent.
    assert await gateway.report(SENT["cafe"], "failed", token=ENV_TOKEN, agent="plain") == 200
    assert await gateway.statuses() == untouched
    # A report naming an agent is verified with that agent's credentials, no other.
    assert await gateway.report(SENT["cafe"], "failed", token=SHOP_TOKEN, agent="cafe") == 403
    assert await gateway.report(SENT["shop"], "failed", token=ENV_TOKEN, agent="shop") == 403
    assert await gateway.statuses() == untouched

    # Each agent's own reports apply.
    assert await gateway.report(SENT["shop"], "delivered", token=SHOP_TOKEN, agent="shop") == 200
    assert await gateway.report(SENT["cafe"], "read", token=CAFE_TOKEN, agent="cafe") == 200
    # A reply sent before callbacks named their agent: verified with the environment's.
    assert await gateway.report(SENT["plain"], "delivered", token=ENV_TOKEN, agent=None) == 200
    assert await gateway.statuses() == {"shop": "delivered", "cafe": "read", "plain": "delivered"}
    assert await gateway.report(SENT["plain"], "read", token=ENV_TOKEN, agent="plain") == 200
    assert (await gateway.statuses())["plain"] == "read"


async def test_every_reply_asks_for_its_reports_at_its_agents_address(
    make_settings: MakeSettings, database: Database, use_embedder: UseEmbedder
) -> None:
    fake = FakeTwilio()
    twilio = TestServer(fake.app())
    await twilio.start_server()
    agents = Agents(database.pool, keyring=Keyring(SECRETS_KEY))
    identity = EmbedderIdentity.of(use_embedder)
    # Both send with the fake's account: 'own' has it in the database, 'plain' from the
    # environment. Sharing an account must not let one's reports reach the other's messages.
    await agents.create("own", embedder=identity)
    await agents.update("own", settings=_account(fake.account_sid, fake.auth_token))
    await agents.create("plain", embedder=identity)
    for agent in await agents.list():
        await database.pool.execute(
            "INSERT INTO outbox (agent_id, channel, recipient, body) VALUES ($1, 'whatsapp', $2, $3)",
            agent.id,
            VISITOR,
            f"Hello from {agent.slug}",
        )
    settings = make_settings(
        public_url=PUBLIC_URL,
        twilio_account_sid=fake.account_sid,
        twilio_auth_token=fake.auth_token,
        twilio_whatsapp_from=WHATSAPP_FROM,
        twilio_api_base=str(twilio.make_url("")).rstrip("/"),
    )
    senders = AgentSenders(settings, agents)
    try:
        await OutboxSender(database.pool, senders, base_backoff=0.01).send_due()
    finally:
        await senders.close()
        await twilio.close()
    callbacks = {m["body"]: m["status_callback"] for m in fake.messages}
    assert callbacks == {
        "Hello from own": f"{PUBLIC_URL}/webhooks/twilio/status?agent=own",
        "Hello from plain": f"{PUBLIC_URL}/webhooks/twilio/status?agent=plain",
    }
    sids = {m["body"].removeprefix("Hello from "): m["sid"] for m in fake.messages}

    gateway = TestServer(create_app(settings))
    await gateway.start_server()
    base = str(gateway.make_url("")).rstrip("/")
    try:
        # Twilio posts plain's report to plain's callback, signed for the public URL.
        delivered = await _post_report(
            base, "?agent=plain", sids["plain"], "delivered",
            token=fake.auth_token, signed_for=PUBLIC_URL,
        )  # fmt: skip
        assert delivered == 200
        # The same account's report on own's callback does not reach plain's message.
        crossed = await _post_report(
            base, "?agent=own", sids["plain"], "failed",
            token=fake.auth_token, signed_for=PUBLIC_URL,
        )  # fmt: skip
        assert crossed == 200
    finally:
        await gateway.close()
    rows = await database.pool.fetch(
        "SELECT a.slug, o.status FROM outbox o JOIN agents a ON a.id = o.agent_id"
    )
    assert {r["slug"]: r["status"] for r in rows} == {"own": "sent", "plain": "delivered"}
