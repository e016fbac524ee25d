"""The admin JSON API on the gateway built by create_app, against real Postgres and Redis."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from httpx_sse import aconnect_sse
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate

from channels.telegram import TELEGRAM
from channels.twilio import TWILIO
from core.settings import Settings
from core.store import Agent, Agents
from core.store.answer_checks import AnswerChecks, NewResult
from core.store.conversations import Conversations, TurnRecord
from core.store.gaps import Gap, group_gaps
from core.store.job_runs import JobRuns
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from gateway.keys import DATABASE, EMBEDDER
from tests.conftest import MakeSettings

Client = TestClient[web.Request, web.Application]

TOKEN = "admin-token-for-tests-0123456789"
ADMIN = "/api/v1/admin"
TWILIO_TOKEN = "twilio-auth-token-secret-value"
BOT_TOKEN = "123456:ABCDEFGHIJKLMNOPQRSTUVWXYZabcdef"


@dataclass
class Admin:
    client: Client
    pool: asyncpg.Pool
    agent: Agent
    settings: Settings

    async def call(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        response = await self.client.request(method, ADMIN + path, **kwargs)
        if response.status == 204:
            return 204, None
        return response.status, await response.json()

    async def get(self, path: str, **params: Any) -> tuple[int, Any]:
        return await self.call("GET", path, params=params)

    async def post(self, path: str, body: Any = None) -> tuple[int, Any]:
        return await self.call("POST", path, json=body)

    async def patch(self, path: str, body: Any) -> tuple[int, Any]:
        return await self.call("PATCH", path, json=body)

    async def delete(self, path: str) -> tuple[int, Any]:
        return await self.call("DELETE", path)

    async def turn(self, channel: str, key: str, question: str, **fields: Any) -> int:
        """A turn saved the way the pipeline saves one; returns its conversation's id."""
        values: dict[str, Any] = {
            "agent_id": self.agent.id,
            "channel": channel,
            "conversation_key": key,
            "question": question,
            "answer": f"About: {question}",
            "save_question": True,
            "rewritten_query": None,
            "confidence": 0.8,
            "low_confidence": False,
            "mode": "extractive",
            "trace": {},
            "language": "en",
        }
        saved = await Conversations(self.pool).save_turn(TurnRecord(**(values | fields)))
        return saved.conversation_id


@pytest.fixture
async def admin(make_settings: MakeSettings) -> AsyncIterator[Admin]:
    settings = make_settings(admin_token=TOKEN)
    client = TestClient(
        TestServer(create_app(settings)), headers={"Authorization": f"Bearer {TOKEN}"}
    )
    await client.start_server()
    app = client.server.app
    pool = app[DATABASE].pool
    agent = await Agents(pool).create(
        "shop", embedder=EmbedderIdentity.of(app[EMBEDDER]), name="The Shop"
    )
    yield Admin(client, pool, agent, settings)
    await client.close()


def _error(body: Any) -> str:
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message"}
    return str(body["error"]["message"])


# -- agents ---------------------------------------------------------------------------------


async def test_agents_are_listed_read_and_changed(admin: Admin) -> None:
    status, body = await admin.get("/agents")
    assert status == 200
    assert [a["slug"] for a in body["items"]] == ["shop"]
    status, agent = await admin.get("/agents/shop")
    assert status == 200
    assert agent["name"] == "The Shop"
    assert agent["channels"]["twilio"] == {
        "configured": False, "account_sid": None, "whatsapp_from": None, "auth_token_set": False,
        "templates": [],
    }  # fmt: skip

    status, changed = await admin.patch(
        "/agents/shop",
        {
            "persona": "You are Sam, the shop's helper.",
            "default_language": "nl",
            "timezone": "Europe/Amsterdam",
            "confidence_threshold": 0.4,
            "contact_route": "hello@shop.example",
            "allowed_origins": ["https://shop.example"],
            "business_hours": {"mon": ["09:00-17:30"], "sun": "closed"},
            "handoff_text": {"en": "A colleague will reply."},
            "settings": {"guardrails": "Never discuss competitors."},
        },
    )
    assert status == 200, changed
    assert changed["persona"] == "You are Sam, the shop's helper."
    assert changed["default_language"] == "nl"
    assert changed["timezone"] == "Europe/Amsterdam"
    assert changed["confidence_threshold"] == pytest.approx(0.4)
    assert changed["allowed_origins"] == ["https://shop.example"]
    assert changed["business_hours"] == {"mon": ["09:00-17:30"], "sun": "closed"}
    assert changed["handoff_text"] == {"en": "A colleague will reply."}
    assert changed["settings"] == {"guardrails": "Never discuss competitors."}
    assert (await admin.get("/agents/shop"))[1] == changed
    # What the rest of Parley reads is what staff set.
    stored = await Agents(admin.pool).get("shop")
    assert stored.contact_route == "hello@shop.example"
    assert stored.settings["business_hours"] == {"mon": ["09:00-17:30"], "sun": "closed"}

    status, cleared = await admin.patch("/agents/shop", {"business_hours": None})
    assert status == 200
    assert cleared["business_hours"] is None
    assert cleared["persona"] == "You are Sam, the shop's helper."


async def test_an_agent_change_applies_to_the_widget_at_once(admin: Admin) -> None:
    """The answering side remembers agents for a few seconds; a change made through the admin
    API is seen there at once, not when that memory runs out."""
    origin = "https://new-shop.example"
    preflight = {"Origin": origin, "Access-Control-Request-Method": "POST"}
    refused = await admin.client.options("/api/v1/agents/shop/chat", headers=preflight)
    assert refused.status == 403  # the agent, read and remembered without this origin

    status, _ = await admin.patch("/agents/shop", {"allowed_origins": [origin]})
    assert status == 200

    allowed = await admin.client.options("/api/v1/agents/shop/chat", headers=preflight)
    assert allowed.status == 204


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"confidence_threshold": 2}, "confidence_threshold"),
        ({"colour": "red"}, "colour"),
        ({"timezone": "Mars/Olympus_Mons"}, "timezone"),
        ({"allowed_origins": ["shop.example"]}, "allowed_origins"),
        ({"business_hours": {"funday": ["09:00-17:00"]}}, "business_hours"),
        ({"business_hours": {"mon": ["9 to 5"]}}, "business_hours"),
        ({"persona": None}, "persona"),
        ({"settings": {"twilio": {"auth_token": "x"}}}, "settings"),
        ({"channels": {"telegram": {"bot_token": "not-a-token"}}}, "channels.telegram.bot_token"),
        ({"settings": {"llm_concurrency": 0}}, "llm_concurrency"),
        ({"settings": {"llm_requests_per_minute": "lots"}}, "llm_requests_per_minute"),
    ],
)
async def test_bad_agent_changes_are_400_naming_the_field(
    admin: Admin, body: dict[str, Any], named: str
) -> None:
    status, error = await admin.patch("/agents/shop", body)
    assert status == 400
    assert named in _error(error)
    assert (await Agents(admin.pool).get("shop")).confidence_threshold == pytest.approx(0.25)


async def test_an_unknown_agent_is_404(admin: Admin) -> None:
    for status, body in (
        await admin.get("/agents/nope"),
        await admin.patch("/agents/nope", {"persona": "x"}),
        await admin.get("/agents/nope/sources"),
        await admin.get("/agents/nope/gaps"),
        await admin.get("/agents/nope/curated"),
        await admin.get("/agents/nope/checks"),
        await admin.post("/agents/nope/widget-key"),
    ):
        assert status == 404
        assert body["error"]["code"] == "agent_not_found"


async def test_channel_credentials_are_write_only(admin: Admin) -> None:
    status, agent = await admin.patch(
        "/agents/shop",
        {
            "channels": {
                "twilio": {
                    "account_sid": "AC" + "0" * 32,
                    "auth_token": TWILIO_TOKEN,
                    "whatsapp_from": "whatsapp:+3197010000000",
                },
                "telegram": {
                    "bot_token": BOT_TOKEN,
                    "webhook_secret": "hook-secret_1-0123456789abcdefghijklm",
                },
            }
        },
    )
    assert status == 200, agent
    shown = json.dumps(agent)
    for secret in (TWILIO_TOKEN, BOT_TOKEN, "hook-secret_1-0123456789abcdefghijklm"):
        assert secret not in shown
    # Every channel of the registry is listed (tests/integration/test_admin_channels.py);
    # these two were given credentials here.
    assert {block: agent["channels"][block] for block in ("twilio", "telegram")} == {
        "twilio": {
            "configured": True,
            "account_sid": "AC" + "0" * 32,
            "whatsapp_from": "whatsapp:+3197010000000",
            "auth_token_set": True,
            "templates": [],
        },
        "telegram": {"configured": True, "bot_token_set": True, "webhook_secret_set": True},
    }
    assert "twilio" not in agent["settings"]
    # The channels use what was stored.
    stored = await Agents(admin.pool).get("shop")
    assert TWILIO.credentials(stored, admin.settings).text("auth_token") == TWILIO_TOKEN
    assert TELEGRAM.credentials(stored, admin.settings).secret("bot_token") is not None

    # Changing one field keeps the others.
    status, agent = await admin.patch(
        "/agents/shop", {"channels": {"twilio": {"whatsapp_from": "+3197010000001"}}}
    )
    assert agent["channels"]["twilio"]["auth_token_set"] is True
    stored = await Agents(admin.pool).get("shop")
    assert TWILIO.credentials(stored, admin.settings).text("whatsapp_from") == "+3197010000001"

    status, error = await admin.patch(
        "/agents/shop", {"channels": {"twilio": {"auth_token": None}}}
    )
    assert status == 400
    assert "channels.twilio.auth_token" in _error(error)

    status, agent = await admin.patch("/agents/shop", {"channels": {"twilio": None}})
    assert status == 200
    assert agent["channels"]["twilio"]["configured"] is False
    assert agent["channels"]["telegram"]["configured"] is True


async def test_the_widget_key_is_rotated(admin: Admin) -> None:
    old = admin.agent.widget_key
    status, agent = await admin.post("/agents/shop/widget-key")
    assert status == 200
    assert agent["widget_key"].startswith("pk_")
    assert agent["widget_key"] != old
    refused = await admin.client.post(
        "/api/v1/agents/shop/chat",
        json={"message": "hello", "session_id": "session-0001"},
        headers={"X-Parley-Key": old},
    )
    assert refused.status == 401


# -- conversations --------------------------------------------------------------------------


async def _at(admin: Admin, conversation_id: int, day: str) -> None:
    await admin.pool.execute(
        "UPDATE conversations SET last_message_at = $2 WHERE id = $1",
        conversation_id,
        datetime.fromisoformat(day).replace(tzinfo=UTC),
    )


async def test_the_conversation_list_filters_and_pages(admin: Admin) -> None:
    web_id = await admin.turn("web", "visitor-aaaa", "Do you ship to Belgium?", confidence=0.8)
    whatsapp = await admin.turn("whatsapp", "whatsapp:+31611111111", "Kunnen jullie dit repareren?",
                                confidence=0.1, low_confidence=True)  # fmt: skip
    telegram = await admin.turn("telegram", "4242", "Is there a discount?", confidence=0.3)
    playground = await admin.turn("playground", "pg-1", "Testing", confidence=0.9)
    other = await Agents(admin.pool).create(
        "other", embedder=EmbedderIdentity.of(admin.client.server.app[EMBEDDER])
    )
    elsewhere = await admin.turn("web", "visitor-bbbb", "Hello", agent_id=other.id)
    await admin.pool.execute(
        "UPDATE conversations SET customer_name = 'Jan' WHERE id = $1", whatsapp
    )
    await admin.pool.execute(
        "UPDATE conversations SET status = 'waiting_for_staff' WHERE id = $1", telegram
    )
    await admin.pool.execute(
        """INSERT INTO summaries (conversation_id, text, through_message, generation)
           VALUES ($1, $2, 1, 0)""",
        web_id,
        "Wants delivery to Belgium.\nWas told 2-3 days.",
    )
    for conversation, day in ((web_id, "2024-01-01"), (whatsapp, "2024-02-01"),
                              (telegram, "2024-03-01"), (elsewhere, "2024-04-01"),
                              (playground, "2024-05-01")):  # fmt: skip
        await _at(admin, conversation, day)

    def ids(body: Any) -> list[int]:
        return [c["id"] for c in body["items"]]

    status, body = await admin.get("/conversations")
    assert status == 200
    assert ids(body) == [elsewhere, telegram, whatsapp, web_id]
    assert body["next_cursor"] is None
    first = body["items"][3]
    assert first["agent"] == "shop"
    assert first["channel"] == "web"
    assert first["customer"] == "visitor-aaaa"
    assert first["summary_line"] == "Wants delivery to Belgium."
    assert first["confidence"] == pytest.approx(0.8)
    assert first["threshold"] == pytest.approx(0.25)
    assert first["low_confidence"] is False
    assert first["messages"] == 2
    assert first["status"] == "bot"
    jan = body["items"][2]
    assert jan["customer"] == "Jan"
    assert jan["low_confidence"] is True
    # Between 0.25 and a raised threshold: below it now, so shown as weak.
    await admin.patch("/agents/shop", {"confidence_threshold": 0.5})

    assert ids((await admin.get("/conversations", agent="shop"))[1]) == [
        telegram, whatsapp, web_id,
    ]  # fmt: skip
    assert ids((await admin.get("/conversations", channel="whatsapp"))[1]) == [whatsapp]
    assert ids((await admin.get("/conversations", low_confidence="true"))[1]) == [
        telegram, whatsapp,
    ]  # fmt: skip
    assert ids((await admin.get("/conversations", waiting="true"))[1]) == [telegram]
    assert ids((await admin.get("/conversations", channel="playground"))[1]) == [playground]
    assert ids(
        (await admin.get("/conversations", since="2024-01-15T00:00:00Z",
                         until="2024-03-15T00:00:00Z"))[1]
    ) == [telegram, whatsapp]  # fmt: skip

    seen: list[int] = []
    cursor: str | None = None
    pages = 0
    while True:
        params = {"limit": 3} | ({"cursor": cursor} if cursor else {})
        status, page = await admin.get("/conversations", **params)
        assert status == 200
        seen += ids(page)
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 2
    assert seen == [elsewhere, telegram, whatsapp, web_id]


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": "many"}, "limit"),
        ({"channel": "fax"}, "channel"),
        ({"since": "yesterday"}, "since"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"colour": "red"}, "colour"),
    ],
)
async def test_bad_conversation_filters_are_400(
    admin: Admin, params: dict[str, Any], named: str
) -> None:
    status, body = await admin.get("/conversations", **params)
    assert status == 400
    assert _error(body).startswith(named)


async def test_a_conversation_has_its_summary_transcript_and_traces(admin: Admin) -> None:
    trace = {
        "query": "and how much is it?",
        "rewritten_query": "shipping cost to Belgium",
        "retrieved": [
            {"chunk_id": 7, "url": "/en/shipping", "match": 0.62, "score": 0.7, "boost": 0.05,
             "reasons": ["language"], "passed": True},
            {"chunk_id": 9, "url": "/en/returns", "match": 0.2, "score": 0.2, "boost": 0.0,
             "reasons": [], "passed": False},
        ],
        "sources": [{"id": 1, "url": "/en/shipping", "title": "Shipping", "score": 0.62}],
        "timings_ms": {"rewrite": 1.5, "retrieve": 12.25, "generate": 30.0, "total": 45.0},
    }  # fmt: skip
    conversation = await admin.turn("web", "visitor-aaaa", "Do you ship to Belgium?")
    await admin.turn("web", "visitor-aaaa", "and how much is it?",
                     rewritten_query="shipping cost to Belgium", trace=trace)  # fmt: skip
    await admin.pool.execute(
        """INSERT INTO summaries (conversation_id, text, through_message, generation)
           VALUES ($1, 'Wants to ship to Belgium.', 2, 0)""",
        conversation,
    )
    status, detail = await admin.get(f"/conversations/{conversation}")
    assert status == 200
    assert detail["conversation"]["id"] == conversation
    assert detail["summary"]["text"] == "Wants to ship to Belgium."
    assert [(m["role"], m["text"]) for m in detail["messages"]] == [
        ("visitor", "Do you ship to Belgium?"),
        ("assistant", "About: Do you ship to Belgium?"),
        ("visitor", "and how much is it?"),
        ("assistant", "About: and how much is it?"),
    ]
    assert len(detail["turns"]) == 2
    last = detail["turns"][1]
    assert last["question"] == "and how much is it?"
    assert last["rewritten_query"] == "shipping cost to Belgium"
    assert last["retrieved"][0] == {
        "url": "/en/shipping", "match": 0.62, "score": 0.7, "passed": True,
        "reasons": ["language"],
    }  # fmt: skip
    assert last["retrieved"][1]["passed"] is False
    assert last["cited"] == [{"id": 1, "url": "/en/shipping", "title": "Shipping", "score": 0.62}]
    assert last["timings_ms"]["retrieve"] == pytest.approx(12.25)
    assert detail["messages"][3]["turn_id"] == last["id"]

    assert (await admin.get("/conversations/999999"))[0] == 404
    assert (await admin.get("/conversations/abc"))[0] == 404


# -- handoff --------------------------------------------------------------------------------


async def test_staff_take_over_reply_and_hand_back(admin: Admin) -> None:
    conversation = await admin.turn("web", "visitor-aaaa", "Can I speak to someone?")
    status, taken = await admin.post(f"/conversations/{conversation}/takeover")
    assert status == 200, taken
    assert taken["status"] == "staff"
    assert taken["assigned_to"] == "admin"

    status, sent = await admin.post(f"/conversations/{conversation}/messages",
                                    {"text": "Hi, I'm Ann from the shop."})  # fmt: skip
    assert status == 201, sent
    _, detail = await admin.get(f"/conversations/{conversation}")
    staff = [m for m in detail["messages"] if m["role"] == "staff"]
    assert [(m["id"], m["text"], m["author"]) for m in staff] == [
        (sent["message_id"], "Hi, I'm Ann from the shop.", "admin")
    ]

    status, back = await admin.post(f"/conversations/{conversation}/handback")
    assert status == 200
    assert back["status"] == "bot"

    status, body = await admin.post(f"/conversations/{conversation}/messages", {"text": ""})
    assert status == 400
    assert _error(body).startswith("text")
    for path in ("takeover", "handback"):
        assert (await admin.post(f"/conversations/999999/{path}"))[0] == 404
    assert (await admin.post("/conversations/999999/messages", {"text": "hi"}))[0] == 404


# -- content gaps ---------------------------------------------------------------------------

GAP_QUESTIONS = [
    "How much does shipping to Belgium cost?",
    "What are the shipping costs to Belgium?",
    "how much does shipping to belgium cost",
    "What does delivery to Belgium cost?",
    "Can I pay with PayPal?",
    "Do you accept PayPal?",
    "Is the store open on Sunday?",
]


async def test_gaps_are_grouped_by_meaning_and_resolved_a_group_at_once(admin: Admin) -> None:
    for number, question in enumerate(GAP_QUESTIONS):
        await admin.turn("web", f"visitor-{number:04d}", question, confidence=0.1,
                         low_confidence=True, gap_reason="weak_match")  # fmt: skip
    await admin.turn("web", "visitor-9999", "Where is my order?", confidence=0.9)

    status, body = await admin.get("/agents/shop/gaps")
    assert status == 200
    assert body["grouped_by"] == "meaning"
    groups = body["items"]
    assert [g["count"] for g in groups] == [4, 2, 1]
    shipping, paypal, sunday = groups
    assert shipping["question"] == "How much does shipping to Belgium cost?"
    assert set(shipping["examples"]) == {
        "How much does shipping to Belgium cost?",
        "What are the shipping costs to Belgium?",
        "What does delivery to Belgium cost?",
    }
    assert len(shipping["gap_ids"]) == 4
    assert shipping["key"] == max(shipping["gap_ids"])
    assert set(paypal["examples"]) == {"Can I pay with PayPal?", "Do you accept PayPal?"}
    assert sunday["examples"] == ["Is the store open on Sunday?"]
    assert shipping["languages"] == ["en"]
    assert shipping["last_seen"] >= shipping["first_seen"]
    stored = await admin.pool.fetchval(
        "SELECT count(*) FROM content_gaps WHERE question_embedding IS NOT NULL"
    )
    assert stored == len(GAP_QUESTIONS)  # embedded once, kept for the next listing

    status, resolved = await admin.post(
        "/agents/shop/gaps/resolve", {"gap_ids": shipping["gap_ids"]}
    )
    assert status == 200
    assert resolved == {"resolved": 4}
    _, after = await admin.get("/agents/shop/gaps")
    assert [g["question"] for g in after["items"]] == [paypal["question"], sunday["question"]]
    assert (await admin.post("/agents/shop/gaps/resolve", {"gap_ids": shipping["gap_ids"]}))[1] == {
        "resolved": 0
    }

    status, error = await admin.post("/agents/shop/gaps/resolve", {"gap_ids": []})
    assert status == 400
    assert _error(error).startswith("gap_ids")
    assert (await admin.post("/agents/shop/gaps/resolve", {"gap_ids": ["x"]}))[0] == 400


async def test_gaps_of_another_agent_are_not_resolved(admin: Admin) -> None:
    await admin.turn("web", "visitor-0001", "Can I pay with PayPal?", gap_reason="weak_match")
    other = await Agents(admin.pool).create(
        "other", embedder=EmbedderIdentity.of(admin.client.server.app[EMBEDDER])
    )
    _, body = await admin.get("/agents/shop/gaps")
    ids = body["items"][0]["gap_ids"]
    assert (await admin.post(f"/agents/{other.slug}/gaps/resolve", {"gap_ids": ids}))[1] == {
        "resolved": 0
    }
    assert len((await admin.get("/agents/shop/gaps"))[1]["items"]) == 1


def test_without_an_embedder_gaps_group_by_wording() -> None:
    now = datetime.now(UTC)
    gaps = [
        Gap(1, "Shipping cost?", "en", "weak_match", 0.1, now - timedelta(minutes=3)),
        Gap(2, "shipping   COST", "en", "weak_match", 0.1, now - timedelta(minutes=2)),
        Gap(3, "What are the shipping costs?", "en", "weak_match", 0.1, now - timedelta(minutes=1)),
        Gap(4, "Verzendkosten?", "nl", "deferred", None, now),
    ]
    groups = group_gaps(gaps, None)
    assert [(g.count, g.gap_ids) for g in groups] == [(2, (2, 1)), (1, (4,)), (1, (3,))]
    assert groups[0].question == "Shipping cost?"


# -- sources --------------------------------------------------------------------------------


async def _settled(admin: Admin, source_id: int) -> dict[str, Any]:
    """The source once its background run has ended (bounded wait)."""
    for _ in range(300):
        status, source = await admin.get(f"/agents/shop/sources/{source_id}")
        assert status == 200
        if not source["running"] and source["status"] in ("ready", "failed"):
            return dict(source)
        await asyncio.sleep(0.1)
    raise AssertionError(f"source {source_id} is still {source['status']}")


async def test_text_sources_are_indexed_in_the_background_reindexed_and_removed(
    admin: Admin,
) -> None:
    status, source = await admin.post(
        "/agents/shop/sources",
        {"kind": "text", "title": "Opening hours", "text": "We are open Monday to Saturday."},
    )
    assert status == 202, source
    assert source["kind"] == "text"
    assert source["location"] == "/texts/opening-hours"
    assert source["status"] == "indexing"
    ready = await _settled(admin, source["id"])
    assert ready["status"] == "ready"
    assert ready["pages"] == 1
    assert ready["last_crawled_at"] is not None
    assert ready["last_error"] is None
    page = await admin.pool.fetchrow("SELECT url, title FROM pages")
    assert dict(page) == {"url": "/texts/opening-hours", "title": "Opening hours"}
    version = (await Agents(admin.pool).get("shop")).knowledge_version

    status, listed = await admin.get("/agents/shop/sources")
    assert [s["id"] for s in listed["items"]] == [source["id"]]

    status, _ = await admin.post(f"/agents/shop/sources/{source['id']}/reindex")
    assert status == 202
    assert (await _settled(admin, source["id"]))["status"] == "ready"
    # Nothing changed, so the index did not either.
    assert (await Agents(admin.pool).get("shop")).knowledge_version == version

    status, removed = await admin.delete(f"/agents/shop/sources/{source['id']}")
    assert status == 200
    assert removed == {"pages_removed": 1}
    assert await admin.pool.fetchval("SELECT count(*) FROM chunks") == 0
    assert (await admin.get(f"/agents/shop/sources/{source['id']}"))[0] == 404
    assert (await admin.delete(f"/agents/shop/sources/{source['id']}"))[0] == 404
    assert (await admin.post(f"/agents/shop/sources/{source['id']}/reindex"))[0] == 404


@pytest.fixture
async def site() -> AsyncIterator[str]:
    """A small website on 127.0.0.1 for the crawler."""

    async def page(request: web.Request) -> web.Response:
        return web.Response(
            text="<html lang='en'><head><title>Delivery</title></head><body><main>"
            "<h1>Delivery</h1><p>Parcels to Belgium arrive within two to three working "
            "days. Shipping costs 4.95 euro per order.</p></main></body></html>",
            content_type="text/html",
        )

    app = web.Application()
    app.router.add_get("/delivery", page)
    server = TestServer(app)
    await server.start_server()
    yield str(server.make_url("")).rstrip("/")
    await server.close()


async def test_url_sources_are_crawled_and_failures_reported(admin: Admin, site: str) -> None:
    status, source = await admin.post(
        "/agents/shop/sources", {"kind": "url", "url": f"{site}/delivery"}
    )
    assert status == 202, source
    ready = await _settled(admin, source["id"])
    assert ready["status"] == "ready", ready
    assert ready["pages"] == 1

    status, broken = await admin.post(
        "/agents/shop/sources", {"kind": "url", "url": f"{site}/missing"}
    )
    failed = await _settled(admin, broken["id"])
    assert failed["status"] == "failed"
    assert "404" in failed["last_error"]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"kind": "url"}, "body"),
        ({"kind": "sitemap", "url": "ftp://shop.example/sitemap.xml"}, "body"),
        ({"kind": "directory", "url": "/etc"}, "kind"),
        ({"kind": "text", "title": "Empty"}, "body"),
        ({"kind": "text", "text": "No title or URL"}, "body"),
        ({"kind": "url", "url": "https://shop.example", "text": "x"}, "body"),
    ],
)
async def test_bad_sources_are_400(admin: Admin, body: dict[str, Any], named: str) -> None:
    status, error = await admin.post("/agents/shop/sources", body)
    assert status == 400
    assert _error(error).startswith(named)
    assert (await admin.get("/agents/shop/sources"))[1] == {"items": []}


# -- curated answers ------------------------------------------------------------------------


async def test_curated_answers_are_created_changed_and_deleted(admin: Admin) -> None:
    status, created = await admin.post(
        "/agents/shop/curated",
        {"answer": "We are open 9-17.", "keywords": ["opening hours"], "language": "en"},
    )
    assert status == 201, created
    assert created["hit_count"] == 0
    assert created["enabled"] is True
    assert created["keywords"] == ["opening hours"]
    path = f"/agents/shop/curated/{created['id']}"

    status, listed = await admin.get("/agents/shop/curated")
    assert [c["id"] for c in listed["items"]] == [created["id"]]

    status, changed = await admin.patch(path, {"answer": "We are open 9-18.", "enabled": False})
    assert status == 200
    assert changed["answer"] == "We are open 9-18."
    assert changed["enabled"] is False
    assert changed["keywords"] == ["opening hours"]
    assert (await admin.get(path))[1] == changed

    assert (await admin.patch(path, {"answer": None}))[0] == 400
    status, error = await admin.patch(path, {"pattern": "(unclosed"})
    assert status == 400
    assert _error(error).startswith("pattern")
    status, error = await admin.patch(path, {"keywords": []})
    assert status == 400
    assert "question, keywords or a pattern" in _error(error)

    assert (await admin.delete(path))[0] == 204
    assert (await admin.get(path))[0] == 404
    assert (await admin.delete(path))[0] == 404
    assert (await admin.patch(path, {"answer": "x"}))[0] == 404


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"keywords": ["hours"]}, "answer"),
        ({"answer": "x"}, "body"),
        ({"answer": "x", "pattern": "[a-"}, "pattern"),
        ({"answer": "x", "keywords": ["a"], "unknown": 1}, "unknown"),
    ],
)
async def test_bad_curated_answers_are_400(admin: Admin, body: dict[str, Any], named: str) -> None:
    status, error = await admin.post("/agents/shop/curated", body)
    assert status == 400
    assert _error(error).startswith(named)


async def test_a_nul_in_a_curated_answer_is_refused_not_a_500(admin: Admin) -> None:
    status, error = await admin.post(
        "/agents/shop/curated", {"answer": "We are open\u0000 9-17.", "keywords": ["hours"]}
    )
    assert status == 400, error
    assert "answer contains a NUL character" in _error(error)
    status, error = await admin.post(
        "/agents/shop/curated", {"answer": "We are open 9-17.", "keywords": ["ho\u0000urs"]}
    )
    assert status == 400, error
    assert "keywords.0 contains a NUL character" in _error(error)
    assert (await admin.get("/agents/shop/curated"))[1] == {"items": []}


# -- answer checks --------------------------------------------------------------------------


async def test_answer_checks_and_their_results(admin: Admin) -> None:
    status, check = await admin.post(
        "/agents/shop/checks",
        {"question": "How long does delivery take?", "expected_facts": ["2-3 working days"]},
    )
    assert status == 201, check
    assert check["expected_facts"] == ["2-3 working days"]
    assert (await admin.get("/agents/shop/checks"))[1]["items"] == [check]
    assert (await admin.get("/agents/shop/checks/results"))[1] == {"items": []}

    run = await JobRuns(admin.pool).start("answer_checks", trigger="manual", slot=None,
                                          instance="test")  # fmt: skip
    assert run is not None
    await AnswerChecks(admin.pool).record(
        run.id,
        NewResult(check["id"], admin.agent.id, passed=False, answer="Soon.",
                  missing_facts=("2-3 working days",), confidence=0.2),
    )  # fmt: skip
    status, results = await admin.get("/agents/shop/checks/results")
    assert status == 200
    [result] = results["items"]
    assert result["question"] == "How long does delivery take?"
    assert result["passed"] is False
    assert result["missing_facts"] == ["2-3 working days"]
    assert (await admin.get("/agents/shop/checks/results", latest="true"))[1] == results

    status, error = await admin.post("/agents/shop/checks", {"question": "Anything?"})
    assert status == 400
    assert "expected_facts or must_cite" in _error(error)
    assert (await admin.delete(f"/agents/shop/checks/{check['id']}"))[0] == 204
    assert (await admin.delete(f"/agents/shop/checks/{check['id']}"))[0] == 404
    assert (await admin.get("/agents/shop/checks/results"))[1] == {"items": []}


# -- staff ----------------------------------------------------------------------------------


async def test_staff_accounts_are_listed_without_their_hashes(admin: Admin) -> None:
    from core.store.staff import StaffAccounts

    await StaffAccounts(admin.pool).create("ann@shop.example", "correct horse battery")
    status, body = await admin.get("/staff")
    assert status == 200
    [ann] = body["items"]
    assert ann["email"] == "ann@shop.example"
    assert ann["display_name"] == "ann"
    assert not any("argon2" in str(v) for v in ann.values())


# -- playground -----------------------------------------------------------------------------


async def _playground(admin: Admin, **body: Any) -> list[tuple[str, dict[str, Any]]]:
    base = str(admin.client.make_url("")).rstrip("/")
    events = []
    async with (
        httpx.AsyncClient(base_url=base, timeout=60) as http,
        aconnect_sse(http, "POST", f"{ADMIN}/agents/shop/playground", json=body,
                     headers={"Authorization": f"Bearer {TOKEN}"}) as source,
    ):  # fmt: skip
        assert source.response.status_code == 200
        async for event in source.aiter_sse():
            events.append((event.event, json.loads(event.data)))
    return events


async def test_the_playground_streams_with_diagnostics_and_overrides(admin: Admin) -> None:
    await admin.post(
        "/agents/shop/sources",
        {"kind": "text", "title": "Delivery",
         "text": "Parcels to Belgium arrive within 2-3 working days. Shipping costs 4.95 euro."},
    )  # fmt: skip
    _, listed = await admin.get("/agents/shop/sources")
    await _settled(admin, listed["items"][0]["id"])

    events = await _playground(
        admin,
        message="How long does delivery to Belgium take?",
        session_id="playground-0001",
        language="nl",
        segment="b2b",
        site_type="shop",
    )
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "status"
    assert "token" in kinds
    assert kinds[-3:] == ["sources", "done", "diagnostics"]
    done = events[-2][1]
    diagnostics = events[-1][1]
    assert diagnostics["session_id"] == "playground-0001"
    assert diagnostics["overrides"] == {
        "language": "nl", "segment": "b2b", "site_type": "shop", "diagnostics": True,
    }  # fmt: skip
    turn = diagnostics["turn"]
    assert turn["id"] == done["turn_id"]
    assert turn["trace"]["language"] == "nl"  # the override, not the question's English
    assert turn["trace"]["channel"] == "playground"
    assert turn["retrieved"][0]["url"] == "/texts/delivery"
    assert "total" in turn["timings_ms"]

    # Marked playground: no usage counted, and not in the conversation list unless asked.
    assert await admin.pool.fetchval("SELECT count(*) FROM usage") == 0
    assert (await admin.get("/conversations"))[1]["items"] == []
    [chat] = (await admin.get("/conversations", channel="playground"))[1]["items"]
    assert chat["id"] == done["conversation_id"]

    quiet = await _playground(admin, message="Do you ship to Belgium?", diagnostics=False)
    assert quiet[-1][0] == "done"


async def test_curated_hits_are_counted(admin: Admin) -> None:
    _, created = await admin.post(
        "/agents/shop/curated", {"answer": "We are open 9-17.", "keywords": ["opening hours"]}
    )
    events = await _playground(admin, message="What are your opening hours?")
    assert events[-2][1]["answer"] == "We are open 9-17."
    assert events[-2][1]["mode"] == "curated"
    _, entry = await admin.get(f"/agents/shop/curated/{created['id']}")
    assert entry["hit_count"] == 1


async def test_playground_requests_are_validated(admin: Admin) -> None:
    status, body = await admin.post("/agents/shop/playground", {"message": ""})
    assert status == 400
    assert _error(body).startswith("message")
    assert (await admin.post("/agents/nope/playground", {"message": "hi"}))[0] == 404


# -- OpenAPI --------------------------------------------------------------------------------


async def test_the_openapi_document_describes_every_admin_route(admin: Admin) -> None:
    response = await admin.client.get("/api/v1/openapi.json", headers={"Authorization": ""})
    assert response.status == 200
    document = await response.json()
    validate(document)  # OpenAPI 3.1, structurally valid
    assert document["openapi"] == "3.1.0"

    registered = set()
    for route in admin.client.server.app.router.routes():
        resource = route.resource
        if resource is None or route.method in ("HEAD", "OPTIONS"):
            continue
        path = re.sub(r"\{(\w+):[^}]+\}", r"{\1}", resource.canonical)
        if path.startswith(("/api/v1/", "/webhooks/")) and path != "/api/v1/openapi.json":
            registered.add((route.method.lower(), path))
    admin_routes = {r for r in registered if r[1].startswith("/api/v1/admin/")}
    assert len(admin_routes) >= 30
    described = {
        (method, path) for path, operations in document["paths"].items() for method in operations
    }
    # Every admin route, and every public channel route too.
    assert registered <= described, registered - described
    assert ("post", "/api/v1/agents/{agent}/chat") in described
    assert ("post", "/webhooks/twilio/{agent}") in described

    patch = document["paths"]["/api/v1/admin/agents/{agent}"]["patch"]
    ref = patch["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = document["components"]["schemas"][ref.rsplit("/", 1)[1]]
    threshold = schema["properties"]["confidence_threshold"]["anyOf"][0]
    assert threshold["maximum"] == 1
    listing = document["paths"]["/api/v1/admin/conversations"]["get"]
    assert {p["name"] for p in listing["parameters"]} >= {"agent", "channel", "low_confidence",
                                                          "waiting", "since", "until", "cursor"}  # fmt: skip
    sign_in = document["paths"]["/api/v1/admin/sign-in"]["post"]
    assert sign_in["security"] == []
    assert patch["security"] == [{"adminToken": []}, {"staffSession": []}]
    play = document["paths"]["/api/v1/admin/agents/{agent}/playground"]["post"]
    assert "text/event-stream" in play["responses"]["200"]["content"]


# -- what Schemathesis found: ids, cursors, types, NUL, events (none may be a 500) ----------

BEYOND_BIGINT = "99999999999999999999"  # no bigint column holds it; asyncpg cannot send it


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", f"/conversations/{BEYOND_BIGINT}"),
        ("GET", "/conversations/9223372036854775808"),
        ("GET", "/conversations/0"),
        ("POST", f"/conversations/{BEYOND_BIGINT}/takeover"),
        ("POST", f"/conversations/{BEYOND_BIGINT}/handback"),
        ("GET", f"/agents/shop/sources/{BEYOND_BIGINT}"),
        ("POST", f"/agents/shop/sources/{BEYOND_BIGINT}/reindex"),
        ("DELETE", f"/agents/shop/sources/{BEYOND_BIGINT}"),
        ("GET", f"/agents/shop/curated/{BEYOND_BIGINT}"),
        ("DELETE", f"/agents/shop/curated/{BEYOND_BIGINT}"),
        ("DELETE", f"/agents/shop/checks/{BEYOND_BIGINT}"),
        ("GET", f"/conversations/{'9' * 5000}"),
    ],
)
async def test_an_id_beyond_64_bits_is_not_found(admin: Admin, method: str, path: str) -> None:
    status, body = await admin.call(method, path)
    assert status == 404, body
    _error(body)


async def test_ids_beyond_64_bits_in_bodies_are_refused(admin: Admin) -> None:
    status, body = await admin.post(f"/conversations/{BEYOND_BIGINT}/messages", {"text": "Hi"})
    assert status == 404, body
    status, body = await admin.patch(f"/agents/shop/curated/{BEYOND_BIGINT}", {"answer": "x"})
    assert status == 404, body
    status, body = await admin.post("/agents/shop/gaps/resolve", {"gap_ids": [int(BEYOND_BIGINT)]})
    assert status == 400, body
    assert _error(body).startswith("gap_ids.0")
    status, body = await admin.post("/inbox/retry", {"ids": [2**63]})
    assert status == 400, body
    assert _error(body).startswith("ids.0")


@pytest.mark.parametrize(
    "path",
    [
        f"/admin/conversations/{BEYOND_BIGINT}",
        f"/admin/agents/shop/curated/{BEYOND_BIGINT}",
        "/admin/agents/%00/sources",
    ],
)
async def test_console_pages_with_ids_beyond_64_bits_are_not_found(admin: Admin, path: str) -> None:
    response = await admin.client.get(path)
    assert response.status == 404, await response.text()


@pytest.mark.parametrize(
    "path",
    [
        f"/admin/conversations/{BEYOND_BIGINT}/take-over",
        f"/admin/conversations/{BEYOND_BIGINT}/reply",
        f"/admin/agents/shop/sources/{BEYOND_BIGINT}/reindex",
        f"/admin/agents/shop/sources/{BEYOND_BIGINT}/remove",
        f"/admin/agents/shop/curated/{BEYOND_BIGINT}",
        f"/admin/agents/shop/curated/{BEYOND_BIGINT}/delete",
    ],
)
async def test_console_forms_with_ids_beyond_64_bits_are_not_found(admin: Admin, path: str) -> None:
    response = await admin.client.post(path, data={"text": "Hello", "answer": "x"})
    assert response.status == 404, await response.text()


def _cursor(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor",
    [
        _cursor(f"2024-01-01T00:00:00+00:00|{BEYOND_BIGINT}"),
        _cursor("2024-01-01T00:00:00+00:00|0"),
        _cursor("2024-01-01T00:00:00+00:00|-5"),
        _cursor("0001-01-01T00:00:00+01:00|5"),  # before year 1 in UTC
        _cursor("9999-12-31T23:00:00-05:00|5"),  # after year 9999 in UTC
        _cursor("2024-01-01T00:00:00|5"),  # no offset: never one we gave out
        _cursor("2024-01-01T00:00:00+00:00|" + "9" * 140),
        "A" * 201,
    ],
)
async def test_a_cursor_we_did_not_give_out_is_400(admin: Admin, cursor: str) -> None:
    status, body = await admin.get("/conversations", cursor=cursor)
    assert status == 400, body
    assert _error(body).startswith("cursor")
    response = await admin.client.get("/admin/conversations", params={"cursor": cursor})
    assert response.status == 400, await response.text()


@pytest.mark.parametrize("params", [{"from": "0001-01-01"}, {"to": "9999-12-31"}])
async def test_console_days_at_the_ends_of_the_calendar_are_400(
    admin: Admin, params: dict[str, str]
) -> None:
    await Agents(admin.pool).update("shop", timezone="Europe/Amsterdam")
    response = await admin.client.get("/admin/conversations", params=params)
    assert response.status == 400, await response.text()


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"until": "0.5"}, "until"),  # not seconds since 1970
        ({"since": "1700000000"}, "since"),
        ({"since": "0001-01-01T00:00:00+01:00"}, "since"),  # before year 1 in UTC
        ({"until": "9999-12-31T23:59:59-05:00"}, "until"),  # after year 9999 in UTC
        ({"limit": "0.5"}, "limit"),
    ],
)
async def test_conversation_filters_are_not_coerced(
    admin: Admin, params: dict[str, Any], named: str
) -> None:
    status, body = await admin.get("/conversations", **params)
    assert status == 400, body
    assert _error(body).startswith(named)


async def test_conversation_filters_take_dates_with_and_without_an_offset(admin: Admin) -> None:
    conversation = await admin.turn("web", "visitor-cccc", "Hello?")
    await _at(admin, conversation, "2024-02-01")
    for since in ("2024-02-01T01:00:00+02:00", "2024-01-31T23:00:00", "2024-02-01"):
        status, body = await admin.get("/conversations", since=since)
        assert status == 200, body
        assert [c["id"] for c in body["items"]] == [conversation], since
    assert (await admin.get("/conversations", until="2024-02-01T00:00:00+01:00"))[1] == {
        "items": [], "next_cursor": None,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "named"),
    [
        ("/agents/shop/gaps/resolve", {"gap_ids": [False]}, "gap_ids.0"),
        ("/agents/shop/gaps/resolve", {"gap_ids": ["1"]}, "gap_ids.0"),
        ("/agents/shop/gaps/resolve", {"gap_ids": [0]}, "gap_ids.0"),
        ("/inbox/retry", {"ids": [True]}, "ids.0"),
        ("/agents/shop/curated", {"answer": "x", "keywords": ["hours"], "enabled": 1}, "enabled"),
        ("/agents/shop/checks", {"question": 7, "must_cite": "/delivery"}, "question"),
    ],
)
async def test_body_types_are_strict(
    admin: Admin, path: str, body: dict[str, Any], named: str
) -> None:
    status, error = await admin.post(path, body)
    assert status == 400, error
    assert _error(error).startswith(named)


async def test_a_strict_body_still_takes_a_whole_number_for_a_fraction(admin: Admin) -> None:
    status, agent = await admin.patch("/agents/shop", {"confidence_threshold": 1})
    assert status == 200, agent
    assert agent["confidence_threshold"] == 1


async def test_a_nul_in_an_answer_check_is_refused_not_a_500(admin: Admin) -> None:
    for body, named in (
        ({"question": "When\u0000?", "must_cite": "/delivery"}, "question"),
        ({"question": "When?", "expected_facts": ["2-3\u0000days"]}, "expected_facts.0"),
        ({"question": "When?", "must_cite": "/deli\u0000very"}, "must_cite"),
    ):
        status, error = await admin.post("/agents/shop/checks", body)
        assert status == 400, error
        assert f"{named} contains a NUL character" in _error(error)
    assert (await admin.get("/agents/shop/checks"))[1] == {"items": []}


async def test_a_nul_in_the_address_is_not_found(admin: Admin) -> None:
    for method, path in (("GET", "/agents/%00"), ("GET", "/agents/sh%00op/curated"),
                         ("POST", "/agents/%00/checks")):  # fmt: skip
        status, body = await admin.call(method, path, json={"question": "q", "must_cite": "/x"})
        assert status == 404, body
        _error(body)


async def test_stream_events_are_documented_as_sent(admin: Admin) -> None:
    """Each event of the playground's stream is one the document names, and its data (JSON in
    the data line) matches the schema the document gives for that event."""
    response = await admin.client.get("/api/v1/openapi.json")
    document = await response.json()
    stream = document["paths"]["/api/v1/admin/agents/{agent}/playground"]["post"]["responses"]
    options = stream["200"]["content"]["text/event-stream"]["schema"]["oneOf"]
    schemas = {}
    for option in options:
        assert option["properties"]["data"]["type"] == "string"
        assert option["properties"]["data"]["contentMediaType"] == "application/json"
        schemas[option["properties"]["event"]["const"]] = option["properties"]["data"][
            "contentSchema"
        ]
    assert set(schemas) == {"status", "token", "sources", "related", "done", "error", "diagnostics"}
    await admin.post("/agents/shop/sources", {"kind": "text", "title": "Delivery",
                                              "text": "Parcels arrive within 2-3 working days."})  # fmt: skip
    await _settled(admin, (await admin.get("/agents/shop/sources"))[1]["items"][0]["id"])

    events = await _playground(admin, message="How long does delivery take?")
    assert {kind for kind, _ in events} >= {"status", "token", "sources", "done", "diagnostics"}
    for kind, data in events:
        schema = {**schemas[kind], "components": document["components"]}
        Draft202012Validator(schema).validate(data)
    chat = document["paths"]["/api/v1/agents/{agent}/chat"]["post"]["responses"]
    assert "text/event-stream" in chat["429"]["content"]  # the rate limit is an error event


@pytest.mark.parametrize(
    "limits",
    [
        "x",
        {"session": "ab"},
        {"session": [0, 5]},
        {"ip": [1]},
        {"ip": [1, 0.5]},
        {"session": [True, 5]},
        {"visitor": [1, 5]},
    ],
)
async def test_malformed_rate_limits_are_refused_not_a_500_at_every_chat(
    admin: Admin, limits: Any
) -> None:
    await _malformed_setting_is_refused(admin, {"rate_limits": limits})


@pytest.mark.parametrize(
    "settings",
    [
        {"answer_threshold": "high"},
        {"answer_threshold": 2},
        {"max_words": "many"},
        {"max_words": 0},
        {"max_words": True},
    ],
)
async def test_malformed_answer_settings_are_refused_not_a_500_at_every_chat(
    admin: Admin, settings: dict[str, Any]
) -> None:
    await _malformed_setting_is_refused(admin, settings)


async def _malformed_setting_is_refused(admin: Admin, settings: dict[str, Any]) -> None:
    status, body = await admin.patch("/agents/shop", {"settings": settings})
    assert status == 400, body
    assert _error(body).startswith("settings")
    agent = (await admin.get("/agents/shop"))[1]
    assert not set(settings) & set(agent["settings"])
    response = await admin.client.post(
        "/api/v1/agents/shop/chat",
        json={"message": "Hello", "session_id": "session-0001"},
        headers={"X-Parley-Key": agent["widget_key"]},
    )
    assert response.status == 200, await response.text()
    await response.read()


async def test_answer_settings_are_set_through_the_admin_api(admin: Admin) -> None:
    settings = {
        "rate_limits": {"session": [0.5, 3], "ip": [2.0, 40]},
        "answer_threshold": 0.5,
        "max_words": 80,
    }
    status, agent = await admin.patch("/agents/shop", {"settings": settings})
    assert status == 200, agent
    assert agent["settings"] == settings
