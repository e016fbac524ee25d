""" "Did this answer your question?" after staff resolve a WhatsApp or Telegram conversation:
the prompt goes out through the real senders to the fake providers, and the answer (a button
press on Telegram, "1" / "2" on WhatsApp) is stored as feedback, a no among the content gaps."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from twilio.request_validator import RequestValidator

from core.feedback import rating_in
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.retrieval.embedders import UseEmbedder
from core.store import Agent, Agents, Database
from core.store.knowledge import KnowledgeStore
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from tests.conftest import MakeSettings
from tests.fakes.telegram import FakeTelegram
from tests.fakes.twilio import FakeTwilio
from tests.support.sse import chat
from tests.support.waiting import wait_until

Client = TestClient[web.Request, web.Application]
TOKEN = "feedback-prompt-admin-token-0123456789"
SECRET = "telegram-webhook-secret-0123456789"
WHATSAPP_FROM = "whatsapp:+14155238886"
CUSTOMER = "whatsapp:+31612345678"
ANNA, BOB = 555000111, 555000222  # Telegram chats
PAGES = [
    {"url": "/en/shipping", "title": "Shipping", "lang": "en",
     "text": "# Shipping\nOrders to Belgium arrive in 2-3 working days. Shipping costs 4.95 euro."},
    {"url": "/en/returns", "title": "Returns", "lang": "en",
     "text": "# Returns\nYou can return any item within 30 days. Refunds arrive within 5 working days."},
    {"url": "/nl/verzending", "title": "Verzending", "lang": "nl",
     "text": "# Verzending\nBestellingen naar België komen binnen 2-3 werkdagen aan."},
]  # fmt: skip
PROMPT = "Did this answer your question? Reply 1 for yes, 2 for no."
THANKS = "Thanks for your feedback!"


@dataclass
class Desk:
    client: Client
    pool: asyncpg.Pool
    agent: Agent
    telegram: FakeTelegram
    twilio: FakeTwilio
    numbers: dict[str, int] = field(default_factory=lambda: {"update": 900000, "sid": 0})

    async def api(self, method: str, path: str, **kw: Any) -> Any:
        response = await self.client.request(method, "/api/v1/admin" + path, **kw)
        assert response.status == 200, await response.text()
        return await response.json()

    async def ask_for_feedback(self) -> None:
        agent = await self.api("PATCH", "/agents/shop", json={"feedback_prompt": True})
        assert agent["feedback_prompt"] is True

    def _next_update(self) -> int:
        self.numbers["update"] += 1
        return self.numbers["update"]

    async def _telegram(self, update: dict[str, Any]) -> None:
        response = await self.client.post(
            "/webhooks/telegram/shop",
            json=update,
            headers={"X-Telegram-Bot-Api-Secret-Token": SECRET},
        )
        assert response.status == 200, await response.text()

    async def telegram_says(self, chat_id: int, text: str, language: str = "en") -> None:
        user = {"id": chat_id, "is_bot": False, "first_name": "Anna", "language_code": language}
        await self._telegram({
            "update_id": self._next_update(),
            "message": {"message_id": self.numbers["update"] % 1000, "date": 1_717_000_000,
                        "text": text, "from": user,
                        "chat": {"id": chat_id, "type": "private", "first_name": "Anna"}},
        })  # fmt: skip

    async def press(self, chat_id: int, data: str, query_id: str) -> str:
        """A customer presses a button under the bot's message in their chat; the update id."""
        update_id = self._next_update()
        bot = {"id": self.telegram.bot_id, "is_bot": True, "first_name": "Parley Test"}
        user = {"id": chat_id, "is_bot": False, "first_name": "Bob", "language_code": "en"}
        await self._telegram({
            "update_id": update_id,
            "callback_query": {
                "id": query_id, "from": user, "chat_instance": "-4711", "data": data,
                "message": {"message_id": 2, "date": 1_717_000_000, "from": bot,
                            "chat": {"id": chat_id, "type": "private"},
                            "text": "Did this answer your question?"},
            },
        })  # fmt: skip
        return str(update_id)

    async def whatsapp_says(self, text: str) -> None:
        self.numbers["sid"] += 1
        fields = {
            "MessageSid": f"SM{self.numbers['sid']:032d}", "AccountSid": self.twilio.account_sid,
            "From": CUSTOMER, "To": WHATSAPP_FROM, "Body": text, "NumMedia": "0",
        }  # fmt: skip
        url = str(self.client.make_url("/webhooks/twilio/shop"))
        signature = RequestValidator(self.twilio.auth_token).compute_signature(url, fields)
        response = await self.client.post(
            "/webhooks/twilio/shop", data=fields, headers={"X-Twilio-Signature": signature}
        )
        assert response.status == 200, await response.text()

    async def telegram_sent(self, count: int) -> list[dict[str, Any]]:
        """The Telegram messages sent, once there are ``count``."""

        async def arrived() -> bool:
            return len(self.telegram.messages) >= count

        await wait_until(arrived)
        return self.telegram.messages

    async def whatsapp_sent(self, count: int) -> list[str]:
        async def arrived() -> bool:
            return len(self.twilio.messages) >= count

        await wait_until(arrived)
        assert {m["to"] for m in self.twilio.messages} == {CUSTOMER}
        return self.twilio.bodies

    async def conversation(self, channel: str, key: str) -> int:
        found: int = await self.pool.fetchval(
            "SELECT id FROM conversations WHERE channel = $1 AND conversation_key = $2",
            channel,
            key,
        )
        return found

    async def last_turn(self, conversation_id: int) -> int:
        found: int = await self.pool.fetchval(
            "SELECT max(id) FROM turns WHERE conversation_id = $1", conversation_id
        )
        return found

    async def resolve(self, conversation_id: int) -> None:
        row = await self.api(
            "POST", f"/conversations/{conversation_id}/status", json={"status": "resolved"}
        )
        assert row["inbox_status"] == "resolved"

    async def checkbox(self) -> str:
        """The console settings page's "Ask 'Did this answer your question?'" box."""
        html = await (await self.client.get("/admin/agents/shop/settings")).text()
        found = re.search(r'<input [^>]*name="feedback_prompt" type="checkbox"[^>]*>', html)
        assert found is not None
        return "checked" if " checked" in found.group() else "unchecked"

    async def queued(self) -> int:
        """Messages put in the outbox so far (the prompt is queued before resolving returns)."""
        count: int = await self.pool.fetchval("SELECT count(*) FROM outbox")
        return count

    async def ratings(self) -> dict[int, str]:
        rows = await self.pool.fetch("SELECT turn_id, rating FROM feedback")
        return {r["turn_id"]: r["rating"] for r in rows}

    async def thumbs_down(self) -> list[str]:
        gaps = await self.api("GET", "/agents/shop/gaps")
        return [g["question"] for g in gaps["items"] if "thumbs_down" in g["reasons"]]


@pytest.fixture
async def desk(
    make_settings: MakeSettings, database: Database, use_embedder: UseEmbedder, tmp_path: Path
) -> AsyncIterator[Desk]:
    agents = Agents(database.pool)
    await agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    agent = await agents.update("shop", allowed_origins=["https://shop.example"])
    path = tmp_path / "pages.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PAGES), encoding="utf-8")
    await Ingestor(KnowledgeStore(database.pool), use_embedder).ingest(
        agent, parse_source(str(path))
    )
    telegram, twilio = FakeTelegram(), FakeTwilio()
    providers = [TestServer(telegram.app()), TestServer(twilio.app())]
    for server in providers:
        await server.start_server()
    settings = make_settings(
        admin_token=TOKEN,
        burst_window_seconds=0.0,
        telegram_bot_token=telegram.token,
        telegram_webhook_secret=SECRET,
        telegram_api_base=str(providers[0].make_url("")).rstrip("/"),
        twilio_account_sid=twilio.account_sid,
        twilio_auth_token=twilio.auth_token,
        twilio_whatsapp_from=WHATSAPP_FROM,
        twilio_api_base=str(providers[1].make_url("")).rstrip("/"),
    )
    client: Client = TestClient(
        TestServer(create_app(settings, background=True)),
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    await client.start_server()
    yield Desk(client, database.pool, await agents.get("shop"), telegram, twilio)
    await client.close()
    for server in providers:
        await server.close()


async def test_telegram_asks_with_two_buttons_and_no_becomes_a_content_gap(desk: Desk) -> None:
    await desk.ask_for_feedback()
    question = "Hoe lang duurt de levering naar België?"
    await desk.telegram_says(ANNA, question, language="nl")
    [answer] = await desk.telegram_sent(1)
    assert "2-3" in answer["text"]
    anna = await desk.conversation("telegram", str(ANNA))
    turn = await desk.last_turn(anna)

    await desk.resolve(anna)
    prompt = (await desk.telegram_sent(2))[1]
    assert (prompt["chat_id"], prompt["text"]) == (ANNA, "Heeft dit je vraag beantwoord?")
    [[yes, no]] = prompt["buttons"]  # one row of two buttons, in the conversation's language
    assert (yes["text"], no["text"]) == ("👍 Ja", "👎 Nee")

    await desk.press(ANNA, no["callback_data"], "cb-anna-1")
    thanks = (await desk.telegram_sent(3))[2]
    assert (thanks["chat_id"], thanks["text"]) == (ANNA, "Bedankt voor je feedback!")
    assert "cb-anna-1" in [a["callback_query_id"] for a in desk.telegram.answered_callbacks]
    assert await desk.ratings() == {turn: "down"}
    assert await desk.thumbs_down() == [question]

    # Bob presses "Yes" with the data of Anna's button: the press names her answer, but it
    # comes from his chat, so nothing is rated, and he is not thanked for anything.
    forged = await desk.press(BOB, yes["callback_data"], "cb-bob-1")

    async def handled() -> bool:
        status = await desk.pool.fetchval(
            "SELECT status FROM inbox WHERE provider_message_id = $1", forged
        )
        return bool(status == "done")

    await wait_until(handled)
    assert await desk.ratings() == {turn: "down"}
    assert await desk.thumbs_down() == [question]
    assert await desk.pool.fetchval(
        "SELECT count(*) FROM outbox WHERE recipient = $1", str(BOB)
    ) == 0  # fmt: skip


async def test_whatsapp_reply_2_is_no_1_is_yes_and_a_question_is_answered(desk: Desk) -> None:
    await desk.ask_for_feedback()
    await desk.whatsapp_says("How long can I return something?")
    assert "30 days" in (await desk.whatsapp_sent(1))[0]
    customer = await desk.conversation("whatsapp", CUSTOMER)
    returns = await desk.last_turn(customer)

    await desk.resolve(customer)
    assert (await desk.whatsapp_sent(2))[1] == PROMPT
    await desk.whatsapp_says("2")
    assert (await desk.whatsapp_sent(3))[2] == THANKS
    assert await desk.ratings() == {returns: "down"}
    assert await desk.thumbs_down() == ["How long can I return something?"]
    # Resolved again with no newer answer: that answer was asked about already.
    queued = await desk.queued()
    await desk.resolve(customer)
    assert await desk.queued() == queued

    await desk.whatsapp_says("How long does delivery to Belgium take?")
    assert "2-3 working days" in (await desk.whatsapp_sent(4))[3]
    delivery = await desk.last_turn(customer)
    await desk.resolve(customer)
    assert (await desk.whatsapp_sent(5))[4] == PROMPT
    await desk.whatsapp_says(" 1 ")
    assert (await desk.whatsapp_sent(6))[5] == THANKS
    assert await desk.ratings() == {returns: "down", delivery: "up"}

    await desk.whatsapp_says("What does shipping cost?")
    assert "4.95" in (await desk.whatsapp_sent(7))[6]
    await desk.resolve(customer)
    assert (await desk.whatsapp_sent(8))[7] == PROMPT
    # Not a rating: answered as any question, and the prompt is over.
    await desk.whatsapp_says("Can I return an item I bought?")
    assert "30 days" in (await desk.whatsapp_sent(9))[8]
    await desk.whatsapp_says("2")
    assert (await desk.whatsapp_sent(10))[9] != THANKS
    assert await desk.ratings() == {returns: "down", delivery: "up"}


async def test_off_by_default_and_never_outside_the_window_or_on_the_website(desk: Desk) -> None:
    assert (await desk.api("GET", "/agents/shop"))["feedback_prompt"] is False
    await desk.telegram_says(ANNA, "How long does delivery to Belgium take?")
    await desk.telegram_sent(1)
    anna = await desk.conversation("telegram", str(ANNA))
    queued = await desk.queued()
    await desk.resolve(anna)
    assert await desk.queued() == queued

    # Staff switch it on in the console.
    assert await desk.checkbox() == "unchecked"
    saved = await desk.client.post(
        "/admin/agents/shop/settings",
        data={"name": "Shop", "default_language": "en", "timezone": "UTC", "threshold": "35",
              "handoff_enabled": "on", "feedback_prompt": "on"},
        allow_redirects=False,
    )  # fmt: skip
    assert saved.status == 303, await saved.text()
    assert await desk.checkbox() == "checked"

    # The website's chat has thumbs of its own: no prompt.
    url = str(desk.client.make_url("/")).rstrip("/")
    await chat(url, "shop", "How long can I return something?", key=desk.agent.widget_key)
    await desk.resolve(await desk.conversation("web", "session-0001"))
    assert await desk.queued() == queued

    # A WhatsApp customer who last wrote 25 hours ago is outside the 24-hour window.
    await desk.whatsapp_says("How long can I return something?")
    await desk.whatsapp_sent(1)
    customer = await desk.conversation("whatsapp", CUSTOMER)
    await desk.pool.execute(
        """UPDATE messages SET created_at = created_at - interval '25 hours'
            WHERE conversation_id = $1 AND role = 'visitor'""",
        customer,
    )
    queued = await desk.queued()
    await desk.resolve(customer)
    assert await desk.queued() == queued

    # Switched on, resolving Anna's conversation again does ask her.
    await desk.resolve(anna)
    prompt = (await desk.telegram_sent(2))[1]
    assert (prompt["chat_id"], prompt["text"]) == (ANNA, "Did this answer your question?")


@pytest.mark.parametrize(
    ("said", "language", "rating"),
    [
        ("1", "en", "up"), (" 2 ", "en", "down"), ("👍", "de", "up"), ("👎🏽", "nl", "down"),
        ("Ja", "nl", "up"), ("nee", "nl", "down"), ("Nein.", "de", "down"), ("ja", "de", "up"),
        ("yes", "nl", "up"), ("no!", "en", "down"),
        ("nee", "de", None), ("12", "en", None), ("2 days", "en", None), ("", "en", None),
        ("yes please tell me more", "en", None),
    ],
)  # fmt: skip
def test_what_counts_as_a_rating(said: str, language: str, rating: str | None) -> None:
    assert rating_in(said, language) == rating
