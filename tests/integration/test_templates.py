"""Approved templates after WhatsApp's 24-hour window, on the real app: configured per agent,
listed and sent through the admin API and the console, delivered by Twilio (ContentSid and
ContentVariables) and Meta (a template message), remembered by the bot; free text refused.

The window is closed by making the conversation's messages 26 hours old in SQL.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from markupsafe import escape
from twilio.request_validator import RequestValidator

from channels.meta import META
from channels.registry import CHANNELS
from channels.twilio import TWILIO
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.retrieval.embedders import UseEmbedder
from core.settings import Settings
from core.store import Agents, Database
from core.store.knowledge import KnowledgeStore
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from tests.conftest import MakeSettings
from tests.fakes.meta import FakeMeta, change, contact, encode, notification, signed, text_message
from tests.fakes.openai import FakeOpenAI
from tests.fakes.twilio import FakeTwilio
from tests.support.console import csrf_of, form_token_of

Client = TestClient[web.Request, web.Application]

TOKEN = "admin-token-for-template-tests-0123456789"
ADMIN = "/api/v1/admin"
VISITOR = "whatsapp:+31612345678"
WHATSAPP_FROM = "whatsapp:+14155238886"
META_CUSTOMER = "31687654321"
ANSWER = "You can return any item within 30 days [1]."
ORDER_TEXT = "Hi {{1}}, your order {{2}} has shipped. Reply here with any questions."
ORDER_SENT = "Hi Sam, your order #1042 has shipped. Reply here with any questions."
TWILIO_TEMPLATES = [
    {"name": "order_update", "provider_id": "HX" + "a1" * 16, "language": "en",
     "text": ORDER_TEXT},
    {"name": "still_there", "provider_id": "HX" + "b2" * 16, "language": "en",
     "text": "Hello! Do you still need help with your question?"},
]  # fmt: skip
META_TEMPLATES = [
    {"name": "order_update", "provider_id": "order_update_v2", "language": "nl",
     "text": "Hoi {{1}}, je bestelling {{2}} is verzonden."},
]  # fmt: skip
PAGES = [
    {"url": "/en/returns", "title": "Returns", "lang": "en",
     "text": "# Returns\nYou can return any item within 30 days. Refunds arrive within 5 working days."},
]  # fmt: skip


@dataclass
class Site:
    """The gateway with its workers, in front of fake Twilio, Meta and OpenAI servers; an
    admin API client with the token and a browser signed in to the console."""

    pool: asyncpg.Pool
    settings: Settings
    browser: Client
    api: aiohttp.ClientSession
    twilio: FakeTwilio
    meta: FakeMeta
    llm: FakeOpenAI
    sent: int = 0

    async def call(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        async with self.api.request(method, self.browser.make_url(ADMIN + path), **kwargs) as r:
            return r.status, await r.json() if r.status != 204 else None

    async def page(self, path: str) -> str:
        response = await self.browser.get(path, allow_redirects=False)
        html = await response.text()
        assert response.status == 200, html
        return html

    async def post_form(self, path: str, data: Any) -> aiohttp.ClientResponse:
        return await self.browser.post(path, data=data, allow_redirects=False)

    async def whatsapp(self, body: str) -> None:
        self.sent += 1
        url = str(self.browser.make_url("/webhooks/twilio/shop"))
        fields = {
            "MessageSid": f"SM{self.sent:032d}", "AccountSid": self.twilio.account_sid,
            "From": VISITOR, "To": WHATSAPP_FROM, "Body": body, "NumMedia": "0",
            "ProfileName": "Sam",
        }  # fmt: skip
        signature = RequestValidator(self.twilio.auth_token).compute_signature(url, fields)
        async with aiohttp.ClientSession() as session:
            headers = {"X-Twilio-Signature": signature}
            async with session.post(url, data=fields, headers=headers) as answer:
                assert answer.status == 200

    async def meta_message(self, text: str) -> None:
        self.sent += 1
        wamid = f"wamid.HBgLMzE2ODc2NTQzMjE{self.sent:020d}"
        value = change(
            self.meta.phone_number_id,
            contacts=[contact(META_CUSTOMER, "Sam")],
            messages=[text_message(wamid, META_CUSTOMER, text)],
        )
        body = encode(notification([value]))
        async with aiohttp.ClientSession() as session:
            url = str(self.browser.make_url("/webhooks/meta/shop"))
            async with session.post(
                url, data=body, headers=signed(body, self.meta.app_secret)
            ) as a:
                assert a.status == 200

    async def conversation(self, channel: str, key: str) -> int:
        found: int = await self.pool.fetchval(
            "SELECT id FROM conversations WHERE channel = $1 AND conversation_key = $2",
            channel,
            key,
        )
        return found

    async def age(self, conversation: int, hours: float = 26) -> None:
        """The customer last wrote ``hours`` ago: WhatsApp's window closed after 24."""
        await self.pool.execute(
            "UPDATE messages SET created_at = created_at - make_interval(secs => $2) "
            "WHERE conversation_id = $1",
            conversation,
            hours * 3600,
        )

    async def counts(self, conversation: int) -> tuple[int, int]:
        """The conversation's messages, and the outbox rows of the whole gateway."""
        messages = await self.pool.fetchval(
            "SELECT count(*) FROM messages WHERE conversation_id = $1", conversation
        )
        outbox = await self.pool.fetchval("SELECT count(*) FROM outbox")
        return messages, outbox

    async def customer_wrote_at(self, conversation: int) -> datetime:
        wrote: datetime = await self.pool.fetchval(
            "SELECT max(created_at) FROM messages WHERE conversation_id = $1 AND role = 'visitor'",
            conversation,
        )
        return wrote


async def eventually(check: Callable[[], Awaitable[bool] | bool], timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("the condition did not come true in time")
        await asyncio.sleep(0.05)


@pytest.fixture
async def site(
    make_settings: MakeSettings, database: Database, use_embedder: UseEmbedder, tmp_path: Path
) -> AsyncIterator[Site]:
    agent = await Agents(database.pool).create("shop", embedder=EmbedderIdentity.of(use_embedder))
    path = tmp_path / "pages.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PAGES), encoding="utf-8")
    await Ingestor(KnowledgeStore(database.pool), use_embedder).ingest(
        agent, parse_source(str(path))
    )
    twilio, meta, llm = FakeTwilio(), FakeMeta(), FakeOpenAI(default_reply=ANSWER)
    servers = [TestServer(twilio.app()), TestServer(meta.app()), TestServer(llm.app())]
    for server in servers:
        await server.start_server()
    settings = make_settings(
        admin_token=TOKEN,
        twilio_account_sid=twilio.account_sid,
        twilio_auth_token=twilio.auth_token,
        twilio_whatsapp_from=WHATSAPP_FROM,
        twilio_api_base=str(servers[0].make_url("")).rstrip("/"),
        meta_app_secret=meta.app_secret,
        meta_verify_token="meta-verify-token-0123456789",
        meta_access_token=meta.access_token,
        meta_phone_number_id=meta.phone_number_id,
        meta_api_base=str(servers[1].make_url("")).rstrip("/"),
        llm_base_url=str(servers[2].make_url("/v1")),
        llm_api_key="sk-test",
        burst_window_seconds=0.0,
    )
    browser: Client = TestClient(TestServer(create_app(settings, background=True)))
    await browser.start_server()
    sign_in = await browser.get("/admin/sign-in")
    signed_in = await browser.post(
        "/admin/sign-in",
        data={"form_token": form_token_of(await sign_in.text()), "token": TOKEN},
        allow_redirects=False,
    )
    assert signed_in.status == 303
    api = aiohttp.ClientSession(
        headers={"Authorization": f"Bearer {TOKEN}"}, cookie_jar=aiohttp.DummyCookieJar()
    )
    try:
        yield Site(database.pool, settings, browser, api, twilio, meta, llm)
    finally:
        await api.close()
        await browser.close()
        for server in servers:
            await server.close()


async def _configure(site: Site) -> None:
    status, agent = await site.call(
        "PATCH",
        "/agents/shop",
        json={"channels": {"twilio": {"templates": TWILIO_TEMPLATES},
                           "meta": {"templates": META_TEMPLATES}}},
    )  # fmt: skip
    assert status == 200, agent
    assert agent["channels"]["twilio"]["templates"] == TWILIO_TEMPLATES
    assert agent["channels"]["meta"]["templates"] == META_TEMPLATES


async def _answered_then_closed(site: Site) -> int:
    """A Twilio WhatsApp conversation the bot answered, whose customer wrote 26 hours ago."""
    await site.whatsapp("How long can I return something?")
    await eventually(lambda: len(site.twilio.messages) == 1)
    conversation = await site.conversation("whatsapp", VISITOR)
    await site.age(conversation)
    return conversation


# -- the admin API ------------------------------------------------------------------------------


async def test_twilio_after_the_window_refuses_free_text_sends_the_template_and_remembers_it(
    site: Site,
) -> None:
    await _configure(site)
    await site.whatsapp("How long can I return something?")
    await eventually(lambda: len(site.twilio.messages) == 1)
    conversation = await site.conversation("whatsapp", VISITOR)

    # While the customer's message is fresh, the window is open for 24 hours from it.
    status, detail = await site.call("GET", f"/conversations/{conversation}")
    assert status == 200
    wrote = await site.customer_wrote_at(conversation)
    assert detail["window"] == {
        "hours": 24.0,
        "open": True,
        "customer_wrote_at": _iso(wrote),
        "closes_at": _iso(wrote + timedelta(hours=24)),
        "closed_at": None,
    }

    await site.age(conversation)
    wrote = await site.customer_wrote_at(conversation)
    status, detail = await site.call("GET", f"/conversations/{conversation}")
    assert detail["window"] == {
        "hours": 24.0,
        "open": False,
        "customer_wrote_at": _iso(wrote),
        "closes_at": None,
        "closed_at": _iso(wrote + timedelta(hours=24)),
    }

    # Free text is refused up front: nothing stored, nothing queued, not taken over.
    before = await site.counts(conversation)
    status, body = await site.call(
        "POST", f"/conversations/{conversation}/messages", json={"text": "Are you still there?"}
    )
    assert status == 409, body
    assert body["error"]["message"].startswith(
        "The customer last wrote 26 hours ago. WhatsApp (Twilio) only delivers approved "
        "templates now"
    )
    assert await site.counts(conversation) == before
    assert await _status(site, conversation) == "bot"

    status, listed = await site.call("GET", f"/conversations/{conversation}/templates")
    assert status == 200
    assert listed["channel"] == "whatsapp"
    assert [(t["name"], t["provider_id"], t["variables"]) for t in listed["items"]] == [
        ("order_update", TWILIO_TEMPLATES[0]["provider_id"], 2),
        ("still_there", TWILIO_TEMPLATES[1]["provider_id"], 0),
    ]
    assert listed["window"] == detail["window"]

    # A wrong name or number of values is the client's mistake, and stores nothing either.
    path = f"/conversations/{conversation}/templates"
    status, body = await site.call("POST", path, json={"name": "nope", "values": []})
    assert status == 400
    assert "no whatsapp template 'nope'" in body["error"]["message"]
    status, body = await site.call("POST", path, json={"name": "order_update", "values": ["Sam"]})
    assert status == 400
    assert "takes 2 values, not 1" in body["error"]["message"]
    assert await site.counts(conversation) == before

    status, sent = await site.call(
        "POST", path, json={"name": "order_update", "values": ["Sam", "#1042"]}
    )
    assert status == 201, sent
    await eventually(lambda: len(site.twilio.messages) == 2)
    message = site.twilio.messages[1]
    assert message["to"] == VISITOR
    assert message["content_sid"] == TWILIO_TEMPLATES[0]["provider_id"]
    assert message["content_variables"] == {"1": "Sam", "2": "#1042"}
    assert "Body" not in site.twilio.requests[-1]["form"]
    stored = await site.pool.fetchrow(
        "SELECT role, text, author FROM messages WHERE id = $1", sent["message_id"]
    )
    assert dict(stored) == {"role": "staff", "text": ORDER_SENT, "author": "admin"}
    outbox = await _outbox_row(site, sent["message_id"])
    assert (outbox["status"], outbox["provider_message_id"]) == ("sent", message["sid"])
    assert outbox["template"] == {
        "name": "order_update",
        "provider_id": TWILIO_TEMPLATES[0]["provider_id"],
        "language": "en",
        "values": ["Sam", "#1042"],
    }
    assert await _status(site, conversation) == "staff"  # sending took it over
    _, detail = await site.call("GET", f"/conversations/{conversation}")
    assert (detail["messages"][-1]["role"], detail["messages"][-1]["text"]) == (
        "staff",
        ORDER_SENT,
    )

    # The bot, back in charge, reads the template as what was said to the customer.
    assert (await site.call("POST", f"/conversations/{conversation}/handback"))[0] == 200
    asked = len(site.llm.turn_requests)
    await site.whatsapp("Thanks! Can I still return it if it does not fit?")
    await eventually(lambda: len(site.twilio.messages) == 3)
    later = site.llm.turn_requests[asked:]
    assert later, "the bot answered without the model"
    assert any(
        {"role": "assistant", "content": ORDER_SENT} in request["messages"] for request in later
    ), later[-1]["messages"]
    # The customer wrote again: free text may go out for another 24 hours.
    _, detail = await site.call("GET", f"/conversations/{conversation}")
    assert detail["window"]["open"] is True


async def test_meta_after_the_window_sends_a_template_message(site: Site) -> None:
    await _configure(site)
    await site.meta_message("Waar blijft mijn bestelling?")
    await eventually(lambda: len(site.meta.messages) == 1)
    conversation = await site.conversation("meta", META_CUSTOMER)
    _, detail = await site.call("GET", f"/conversations/{conversation}")
    assert detail["window"]["open"] is True
    await site.age(conversation)

    before = await site.counts(conversation)
    status, body = await site.call(
        "POST", f"/conversations/{conversation}/messages", json={"text": "Hallo?"}
    )
    assert status == 409
    assert "WhatsApp (Meta) only delivers approved templates now" in body["error"]["message"]
    assert await site.counts(conversation) == before

    status, listed = await site.call("GET", f"/conversations/{conversation}/templates")
    assert [t["name"] for t in listed["items"]] == ["order_update"]
    assert listed["window"]["open"] is False
    status, sent = await site.call(
        "POST",
        f"/conversations/{conversation}/templates",
        json={"name": "order_update", "values": ["Sam", "#1042"]},
    )
    assert status == 201, sent
    await eventually(lambda: len(site.meta.messages) == 2)
    assert site.meta.messages[1]["body"] == {
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "to": META_CUSTOMER,
        "type": "template",
        "template": {
            "name": "order_update_v2",
            "language": {"code": "nl"},
            "components": [
                {
                    "type": "body",
                    "parameters": [
                        {"type": "text", "text": "Sam"},
                        {"type": "text", "text": "#1042"},
                    ],
                }
            ],
        },
    }
    text = await site.pool.fetchval("SELECT text FROM messages WHERE id = $1", sent["message_id"])
    assert text == "Hoi Sam, je bestelling #1042 is verzonden."
    await eventually(lambda: _sent(site, sent["message_id"]))
    assert (await _outbox_row(site, sent["message_id"]))["provider_message_id"] == (
        site.meta.messages[1]["id"]
    )


async def test_a_channel_without_a_window_lists_no_templates_and_sends_none(site: Site) -> None:
    await _configure(site)
    conversation = await site.pool.fetchval(
        """INSERT INTO conversations (agent_id, channel, conversation_key)
           SELECT id, 'telegram', '424242' FROM agents WHERE slug = 'shop' RETURNING id"""
    )
    status, listed = await site.call("GET", f"/conversations/{conversation}/templates")
    assert (status, listed) == (200, {"channel": "telegram", "items": [], "window": None})
    _, detail = await site.call("GET", f"/conversations/{conversation}")
    assert detail["window"] is None
    status, body = await site.call(
        "POST",
        f"/conversations/{conversation}/templates",
        json={"name": "order_update", "values": ["Sam", "#1042"]},
    )
    assert status == 400
    assert "no telegram template 'order_update'" in body["error"]["message"]
    assert (await site.call("GET", "/conversations/999999/templates"))[0] == 404
    assert (await site.call("POST", "/conversations/999999/templates", json={"name": "x"}))[
        0
    ] == 404


# -- configuring templates --------------------------------------------------------------------


async def test_templates_are_configured_per_agent_and_checked(site: Site) -> None:
    await _configure(site)
    stored = await Agents(site.pool).get("shop")
    # Templates are not credentials: the agent still sends with the environment's account.
    for channel in (TWILIO, META):
        assert channel.credentials(stored, site.settings).source == "environment"
    _, agent = await site.call("GET", "/agents/shop")
    assert agent["channels"]["twilio"]["configured"] is False
    assert "templates" not in agent["channels"]["telegram"]

    good = TWILIO_TEMPLATES[0]
    refused = {
        "two templates are named 'order_update'": [good, {**good, "provider_id": "HX" + "c" * 32}],
        "missing: {{2}}": [{**good, "text": "Hi {{1}}, see {{3}}"}],
        "{{name}} is not a placeholder": [{**good, "text": "Hi {{name}}"}],
        "templates.0.name": [{**good, "name": "Order Update"}],
        "templates.0.provider_id": [{**good, "provider_id": "order_update"}],
        "templates.0.language": [{**good, "language": "english please"}],
        "templates.0.text": [{**good, "text": "x" * 1025}],
    }
    for said, templates in refused.items():
        status, body = await site.call(
            "PATCH", "/agents/shop", json={"channels": {"twilio": {"templates": templates}}}
        )
        assert status == 400, (said, body)
        assert said in body["error"]["message"], (said, body)
    status, body = await site.call(
        "PATCH", "/agents/shop", json={"channels": {"telegram": {"templates": []}}}
    )
    assert status == 400, body
    assert (await Agents(site.pool).get("shop")).settings == stored.settings

    # Credentials of the agent's own come and go; its templates stay until changed.
    own = {"account_sid": "AC" + "0" * 32, "auth_token": "own-token",
           "whatsapp_from": "whatsapp:+3197010000000"}  # fmt: skip
    status, agent = await site.call("PATCH", "/agents/shop", json={"channels": {"twilio": own}})
    assert status == 200, agent
    assert agent["channels"]["twilio"]["configured"] is True
    assert agent["channels"]["twilio"]["templates"] == TWILIO_TEMPLATES
    status, agent = await site.call("PATCH", "/agents/shop", json={"channels": {"twilio": None}})
    assert agent["channels"]["twilio"]["configured"] is False
    assert agent["channels"]["twilio"]["templates"] == TWILIO_TEMPLATES
    status, agent = await site.call(
        "PATCH", "/agents/shop", json={"channels": {"twilio": {"templates": []}}}
    )
    assert status == 200, agent
    assert agent["channels"]["twilio"] == {
        "configured": False, "account_sid": None, "whatsapp_from": None,
        "auth_token_set": False, "templates": [],
    }  # fmt: skip
    assert "twilio" not in (await Agents(site.pool).get("shop")).settings


async def test_openapi_documents_templates_and_the_window(site: Site) -> None:
    async with site.api.get(site.browser.make_url("/api/v1/openapi.json")) as response:
        document = await response.json()
    paths = document["paths"]
    templates = paths["/api/v1/admin/conversations/{id}/templates"]
    assert templates["get"]["x-parley-role"] == templates["post"]["x-parley-role"] == "agent"
    assert "201" in templates["post"]["responses"]
    schemas = document["components"]["schemas"]
    assert set(schemas["TemplateSendBody"]["properties"]) == {"name", "values"}
    assert set(schemas["WindowOut"]["properties"]) == {
        "hours", "open", "customer_wrote_at", "closes_at", "closed_at",
    }  # fmt: skip
    assert "window" in schemas["ConversationDetailOut"]["properties"]
    assert "409" in paths["/api/v1/admin/conversations/{id}/messages"]["post"]["responses"]
    for channel in CHANNELS:
        patch = schemas[f"{channel.block.capitalize()}Patch"]["properties"]
        assert ("templates" in patch) is (channel.customer_window_hours is not None)


# -- the console ------------------------------------------------------------------------------


async def test_the_console_says_the_window_closed_and_sends_a_chosen_template(site: Site) -> None:
    await _configure(site)
    conversation = await _answered_then_closed(site)
    path = f"/admin/conversations/{conversation}"
    html = await site.page(path)
    assert "<strong>The customer last wrote 26 hours ago.</strong> WhatsApp (Twilio) only " in html
    assert "delivers approved templates now." in html
    assert 'id="reply-text"' not in html  # no free-text reply box that could only fail
    forms = re.findall(r'<form method="post" action="([^"]+)" class="template-form"', html)
    assert forms == [f"{path}/template"] * 2
    assert html.count("Value for {{1}}") == 1  # order_update takes two values; still_there none
    assert html.count("Value for {{2}}") == 1
    assert f'data-template-text="{escape(ORDER_TEXT)}"' in html
    csrf = csrf_of(html)

    # A stale page's free text is refused with the reason; so is a template missing a value.
    refused = await site.post_form(f"{path}/reply", {"csrf_token": csrf, "text": "Hello?"})
    assert refused.status == 409
    assert "The customer last wrote 26 hours ago." in await refused.text()
    missing = await site.post_form(
        f"{path}/template",
        [("csrf_token", csrf), ("name", "order_update"), ("values", "Sam"), ("values", "")],
    )
    assert missing.status == 400
    shown = await missing.text()
    assert "Value for {{2}}: String should have at least 1 character" in shown
    assert 'value="Sam"' in shown  # what staff typed is kept, with the preview filled in
    assert "Hi Sam, your order {{2}} has shipped." in shown
    assert len(site.twilio.messages) == 1

    sent = await site.post_form(
        f"{path}/template",
        [("csrf_token", csrf), ("name", "order_update"), ("values", "Sam"),
         ("values", "#1042")],
    )  # fmt: skip
    assert sent.status == 303
    assert sent.headers["Location"] == f"{path}?done=template-sent#reply"
    html = await site.page(f"{path}?done=template-sent")
    assert "The template is on its way." in html
    staff = re.findall(r'<li class="msg staff">.*?<div class="text">(.*?)</div>', html, re.S)
    assert staff == [ORDER_SENT]
    await eventually(lambda: len(site.twilio.messages) == 2)
    assert site.twilio.messages[1]["content_variables"] == {"1": "Sam", "2": "#1042"}

    # Without its CSRF token, the form does nothing.
    forged = await site.post_form(f"{path}/template", {"name": "still_there"})
    assert forged.status == 403
    await asyncio.sleep(0.2)
    assert len(site.twilio.messages) == 2


async def test_the_console_shows_when_an_open_window_closes(site: Site) -> None:
    await site.whatsapp("How long can I return something?")
    await eventually(lambda: len(site.twilio.messages) == 1)
    conversation = await site.conversation("whatsapp", VISITOR)
    html = await site.page(f"/admin/conversations/{conversation}")
    closes = (await site.customer_wrote_at(conversation)) + timedelta(hours=24)
    assert "Free text reaches the customer until" in html
    assert f'<time datetime="{closes.isoformat()}">' in html
    assert 'name="text"' in html
    assert "only delivers approved templates now" not in html
    # No templates yet: nothing to offer besides the reply; once closed, an admin is told
    # where to add them.
    assert "Send an approved template instead" not in html
    await site.age(conversation)
    html = await site.page(f"/admin/conversations/{conversation}")
    assert "No approved templates are set up for this agent on WhatsApp (Twilio)." in html
    assert 'href="/admin/agents/shop/settings#templates"' in html

    await _configure(site)
    await site.pool.execute(
        "UPDATE messages SET created_at = now() WHERE conversation_id = $1", conversation
    )
    html = await site.page(f"/admin/conversations/{conversation}")
    assert "Send an approved template instead" in html
    assert 'class="template-form"' in html


async def test_the_settings_page_edits_templates_one_row_each(site: Site) -> None:
    await _configure(site)
    html = await site.page("/admin/agents/shop/settings")
    assert '<section id="templates"' in html
    for block in ("twilio", "meta"):
        assert f'<fieldset class="channel-templates" data-channel="{block}">' in html
    assert 'class="channel-templates" data-channel="telegram"' not in html
    assert '<label for="f-twilio_t1_provider_id">Content SID</label>' in html
    assert '<label for="f-meta_t1_provider_id">Template name</label>' in html
    assert 'value="order_update"' in html
    assert html.count("New template</legend>") == 2  # one empty row per channel
    csrf = csrf_of(html)

    def row(block: str, number: int, template: dict[str, str], **extra: str) -> list[Any]:
        key = f"{block}_t{number}"
        return [
            (f"{key}_{f}", template[f]) for f in ("name", "provider_id", "language", "text")
        ] + [(f"{key}_{k}", v) for k, v in extra.items()]

    new = {"name": "delivery_delay", "provider_id": "HX" + "d4" * 16, "language": "en",
           "text": "Hi {{1}},\r\nyour parcel is delayed."}  # fmt: skip
    blank = {"name": "", "provider_id": "", "language": "", "text": ""}
    form = [
        ("csrf_token", csrf),
        ("twilio_rows", "3"),
        *row("twilio", 1, TWILIO_TEMPLATES[0], stored="1"),
        *row("twilio", 2, TWILIO_TEMPLATES[1], stored="1", remove="on"),
        *row("twilio", 3, new),
        ("meta_rows", "2"),
        *row("meta", 1, META_TEMPLATES[0], stored="1"),
        *row("meta", 2, blank),
    ]
    saved = await site.post_form("/admin/agents/shop/settings/templates", form)
    assert saved.status == 303, await saved.text()
    assert saved.headers["Location"] == "/admin/agents/shop/settings?done=templates-saved#templates"
    _, agent = await site.call("GET", "/agents/shop")
    assert agent["channels"]["twilio"]["templates"] == [
        TWILIO_TEMPLATES[0],
        {**new, "text": "Hi {{1}},\nyour parcel is delayed."},
    ]
    assert agent["channels"]["meta"]["templates"] == META_TEMPLATES

    wrong = [("csrf_token", csrf), ("twilio_rows", "1"),
             *row("twilio", 1, {**new, "text": "Hi {{2}}"}), ("meta_rows", "0")]  # fmt: skip
    refused = await site.post_form("/admin/agents/shop/settings/templates", wrong)
    assert refused.status == 400
    shown = await refused.text()
    assert "WhatsApp (Twilio) template 1, text: number the placeholders" in shown
    assert "Hi {{2}}</textarea>" in shown  # what was typed is shown again to be corrected
    _, agent = await site.call("GET", "/agents/shop")
    assert len(agent["channels"]["twilio"]["templates"]) == 2


# -- helpers ------------------------------------------------------------------------------------


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


async def _status(site: Site, conversation: int) -> str:
    found: str = await site.pool.fetchval(
        "SELECT status FROM conversations WHERE id = $1", conversation
    )
    return found


async def _outbox_row(site: Site, message_id: int) -> asyncpg.Record:
    async def sent() -> bool:
        return await _sent(site, message_id)

    await eventually(sent)
    row: asyncpg.Record = await site.pool.fetchrow(
        "SELECT status, provider_message_id, template FROM outbox WHERE message_id = $1",
        message_id,
    )
    return row


async def _sent(site: Site, message_id: int) -> bool:
    status = await site.pool.fetchval("SELECT status FROM outbox WHERE message_id = $1", message_id)
    return bool(status == "sent")
