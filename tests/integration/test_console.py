"""The staff console on the gateway built by create_app: sign-in, CSRF, every page, every form."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import asyncpg
import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient, TestServer

from channels.registry import BY_NAME
from core.keyring import Keyring
from core.retrieval.embedders import UseEmbedder
from core.settings import Settings
from core.store import Database
from core.store.inbox import Inbox
from core.store.staff import StaffAccounts
from gateway.admin.console import conversations as conversation_pages
from gateway.app import create_app
from gateway.keys import ADMIN, ANSWERING
from tests.conftest import SECRETS_KEY, MakeSettings
from tests.support.console import (
    BOT_TOKEN,
    PASSWORD,
    SECRETS,
    STAFF_EMAIL,
    SUMMARY,
    TELEGRAM,
    TOKEN,
    TWILIO_SID,
    TWILIO_TOKEN,
    WEBHOOK_SECRET,
    WHATSAPP,
    Seeded,
    csrf_of,
    seed,
    sign_in,
)
from tests.support.deliveries import add_delivery

Client = TestClient[web.Request, web.Application]


@dataclass
class Console:
    client: Client
    pool: asyncpg.Pool
    data: Seeded

    @property
    def shop(self) -> str:
        return f"/admin/agents/{self.data.agent.slug}"

    async def page(self, path: str, status: int = 200) -> str:
        response = await self.client.get(path, allow_redirects=False)
        html = await response.text()
        assert response.status == status, html
        if status == 200:
            assert response.content_type == "text/html"
        return html

    async def csrf(self) -> str:
        return csrf_of(await self.page("/admin/conversations"))

    async def post(
        self, path: str, data: dict[str, Any] | None = None, **kw: Any
    ) -> ClientResponse:
        fields = {"csrf_token": await self.csrf(), **(data or {})}
        return await self.client.post(path, data=fields, allow_redirects=False, **kw)

    async def submit(self, path: str, data: dict[str, Any] | None = None) -> str:
        """Post a form that must succeed: redirected to a page that says so."""
        response = await self.post(path, data)
        assert response.status == 303, await response.text()
        return response.headers["Location"]


def opened(sealed: Any) -> str:
    """A channel secret as stored (sealed), opened with the tests' key."""
    return Keyring(SECRETS_KEY).open(sealed, what="a stored secret").get_secret_value()


def set_cookies(response: ClientResponse) -> SimpleCookie:
    cookie: SimpleCookie = SimpleCookie()
    for header in response.headers.getall("Set-Cookie", ()):
        cookie.load(header)
    return cookie


@pytest.fixture
async def gateway(
    make_settings: MakeSettings,
    settings: Settings,
    database: Database,
    cache: Any,
    use_embedder: UseEmbedder,
    tmp_path: Path,
) -> AsyncIterator[tuple[Client, Seeded]]:
    data = await seed(settings, database, cache, use_embedder, tmp_path)
    client: Client = TestClient(TestServer(create_app(make_settings(admin_token=TOKEN))))
    await client.start_server()
    yield client, data
    await client.close()


@pytest.fixture
async def console(gateway: tuple[Client, Seeded], database: Database) -> Console:
    client, data = gateway
    response = await sign_in(client, token=TOKEN)
    assert response.status == 303
    return Console(client, database.pool, data)


# -- signing in -----------------------------------------------------------------------------


async def test_pages_send_strangers_to_sign_in_and_forms_get_401(
    gateway: tuple[Client, Seeded],
) -> None:
    client, data = gateway
    page = await client.get("/admin/conversations?channel=web", allow_redirects=False)
    assert page.status == 303
    location = urlsplit(page.headers["Location"])
    assert location.path == "/admin/sign-in"
    assert parse_qs(location.query)["next"] == ["/admin/conversations?channel=web"]
    form = await client.post(
        f"/admin/conversations/{data.conversations[WHATSAPP]}/take-over",
        data={"csrf_token": "x"},
    )
    assert form.status == 401
    assert (await form.json())["error"]["code"] == "unauthorized"
    api = await client.get("/api/v1/admin/conversations")
    assert api.status == 401
    # The sign-in page and the console's files need nobody.
    assert (await client.get("/admin/sign-in")).status == 200
    css = await client.get("/admin/static/admin.css")
    assert css.status == 200
    assert css.content_type == "text/css"
    script = await client.get("/admin/static/admin.js")
    assert script.status == 200
    assert script.content_type == "application/javascript"
    # Revalidated, not downloaded again, while the release is the same.
    etag = script.headers["ETag"]
    again = await client.get("/admin/static/admin.js", headers={"If-None-Match": etag})
    assert (again.status, await again.read()) == (304, b"")


async def test_sign_in_with_the_admin_token_sets_a_strict_http_only_cookie(
    gateway: tuple[Client, Seeded],
) -> None:
    client, _ = gateway
    response = await sign_in(client, token=TOKEN, next="/admin/agents")
    assert response.status == 303
    assert response.headers["Location"] == "/admin/agents"
    session = set_cookies(response)["parley_admin"]
    assert session["httponly"] is True
    assert session["samesite"] == "Strict"
    assert session["path"] == "/"
    assert not session["secure"]  # plain http here; https gateways set it
    assert session.value not in (await (await client.get("/admin/agents")).text())
    page = await client.get("/admin/conversations")
    assert page.status == 200
    html = await page.text()
    assert "Sign out" in html
    assert page.headers["Cache-Control"] == "no-store"
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    # A signed-in browser that opens the sign-in page goes on to the console.
    again = await client.get("/admin/sign-in", allow_redirects=False)
    assert again.status == 303
    # An address elsewhere is never where sign-in leads.
    client.session.cookie_jar.clear()
    away = await sign_in(client, token=TOKEN, next="//evil.example/")
    assert away.headers["Location"] == "/admin"


OFF_SITE_NEXT = [
    "/\t/evil.example",
    "/\n/evil.example",
    "//evil.example",
    "/\\evil.example",
    "https://evil.example",
]


@pytest.mark.parametrize("next_path", OFF_SITE_NEXT)
async def test_sign_in_never_leads_off_site(gateway: tuple[Client, Seeded], next_path: str) -> None:
    client, _ = gateway
    posted = await sign_in(client, token=TOKEN, next=next_path)
    assert posted.status == 303
    assert posted.headers["Location"] == "/admin"
    # Signed in now, so the sign-in page redirects at once: to the start page too.
    opened = await client.get("/admin/sign-in", params={"next": next_path}, allow_redirects=False)
    assert opened.status == 303
    assert opened.headers["Location"] == "/admin"


async def test_sign_in_follows_a_console_page_by_get_and_by_post(
    gateway: tuple[Client, Seeded],
) -> None:
    client, _ = gateway
    posted = await sign_in(client, token=TOKEN, next="/admin/conversations?channel=web")
    assert posted.headers["Location"] == "/admin/conversations?channel=web"
    opened = await client.get(
        "/admin/sign-in", params={"next": "/admin/conversations"}, allow_redirects=False
    )
    assert opened.status == 303
    assert opened.headers["Location"] == "/admin/conversations"


async def test_sign_in_with_a_staff_account_and_with_a_wrong_password(
    gateway: tuple[Client, Seeded], database: Database
) -> None:
    client, _ = gateway
    await StaffAccounts(database.pool).create(STAFF_EMAIL, PASSWORD, display_name="Sam Visser")
    wrong = await sign_in(client, email=STAFF_EMAIL, password="not the password")
    assert wrong.status == 401
    html = await wrong.text()
    assert "wrong email address or password" in html
    assert f'value="{STAFF_EMAIL}"' in html  # what was typed stays
    assert "parley_admin" not in set_cookies(wrong)
    wrong_token = await sign_in(client, token="not-the-token")
    assert wrong_token.status == 401
    assert "wrong admin token" in await wrong_token.text()

    right = await sign_in(client, email=STAFF_EMAIL.upper(), password=PASSWORD)
    assert right.status == 303
    html = await (await client.get("/admin/conversations")).text()
    assert "Sam Visser" in html

    signed_out = await client.post(
        "/admin/sign-out", data={"csrf_token": csrf_of(html)}, allow_redirects=False
    )
    assert signed_out.status == 303
    assert signed_out.headers["Location"] == "/admin/sign-in"
    assert set_cookies(signed_out)["parley_admin"].value == ""
    after = await client.get("/admin/conversations", allow_redirects=False)
    assert after.status == 303


async def test_a_sign_in_form_without_its_own_token_is_refused(
    gateway: tuple[Client, Seeded],
) -> None:
    client, _ = gateway
    await client.get("/admin/sign-in")
    forged = await client.post(
        "/admin/sign-in", data={"form_token": "forged", "token": TOKEN}, allow_redirects=False
    )
    assert forged.status == 403
    assert "parley_admin" not in set_cookies(forged)


# -- CSRF -----------------------------------------------------------------------------------


async def test_every_kind_of_form_needs_the_csrf_token(console: Console) -> None:
    shop, data = console.shop, console.data
    whatsapp = data.conversations[WHATSAPP]
    forms = [
        f"/admin/conversations/{whatsapp}/take-over",
        f"/admin/conversations/{whatsapp}/hand-back",
        f"/admin/conversations/{whatsapp}/reply",
        f"{shop}/gaps/resolve",
        f"{shop}/sources",
        f"{shop}/sources/{data.failed_source_id}/reindex",
        f"{shop}/sources/{data.failed_source_id}/remove",
        f"{shop}/curated",
        f"{shop}/curated/{data.curated_id}",
        f"{shop}/curated/{data.curated_id}/delete",
        f"{shop}/checks",
        f"{shop}/checks/{data.check_ids[0]}/delete",
        f"{shop}/settings",
        f"{shop}/settings/channels",
        f"{shop}/settings/widget-key",
        "/admin/inbox/retry",
        "/admin/sign-out",
    ]
    fields = {"text": "Hello from staff", "answer": "x", "question": "y", "name": "Hijacked"}
    for path in forms:
        for token in (None, "wrong-token"):
            sent = fields if token is None else {**fields, "csrf_token": token}
            response = await console.client.post(path, data=sent, allow_redirects=False)
            assert response.status == 403, path
            assert (await response.json())["error"]["code"] == "csrf_failed"
    # Nothing changed, and the session still works.
    pool = console.pool
    assert await pool.fetchval("SELECT count(*) FROM messages WHERE role = 'staff'") == 0
    assert await pool.fetchval("SELECT name FROM agents WHERE slug = 'shop'") == "Noordkaap Shop"
    assert await pool.fetchval("SELECT count(*) FROM curated_answers") == 1
    assert await pool.fetchval("SELECT widget_key FROM agents WHERE slug = 'shop'") == (
        data.agent.widget_key
    )
    assert (await console.client.get("/admin/conversations")).status == 200


# -- the pages ------------------------------------------------------------------------------


async def test_the_conversation_list_shows_every_channel(console: Console) -> None:
    html = await console.page("/admin/conversations")
    rows = re.findall(r'<tr data-conversation="(\d+)">', html)
    listed = {key for key, id_ in console.data.conversations.items() if str(id_) in rows}
    assert listed == {WHATSAPP, TELEGRAM, "web-session-0001", "web-session-0002", "api-customer-42"}
    for channel in (BY_NAME["whatsapp"].title, BY_NAME["telegram"].title, "Website", "API"):
        assert f">{channel}</span>" in html
    assert WHATSAPP in html
    assert "Anna de Vries" in html  # a customer with a name is shown by name
    assert SUMMARY.splitlines()[0] in html  # the summary's first line
    assert SUMMARY.splitlines()[1] not in html
    assert "Waiting for staff" in html
    # A weak answer's match is amber, a good one is not.
    assert re.search(r'class="match low"[^>]*>knowledge match \d+%', html)
    assert re.search(r'class="match">knowledge match \d+%', html)
    # Times are the agent's (Amsterdam is ahead of UTC all year).
    assert re.search(r'<time datetime="[^"]+\+00:00">\d{4}-\d\d-\d\d \d\d:\d\d</time>', html)


async def test_the_list_says_what_a_conversation_is_about_from_its_first_exchange(
    console: Console,
) -> None:
    asked = (
        "Can I return the rain jacket I bought in your Utrecht shop by post instead of "
        "bringing it back? I have the receipt."
    )
    chat = await console.client.post(
        "/api/v1/agents/shop/chat",
        json={"message": asked, "session_id": "web-session-0003"},
        headers={"X-Parley-Key": console.data.agent.widget_key, "Origin": "https://shop.example"},
    )
    assert chat.status == 200
    assert "event: done" in await chat.text()
    await console.client.server.app[ANSWERING].pipeline.memory.drain()
    # No model here: the question's first sentence, cut at a word.
    topic = "Can I return the rain jacket I bought in your Utrecht shop by post instead of…"

    api = await console.client.get("/api/v1/admin/conversations")
    assert api.status == 200
    rows = {r["conversation_key"]: r for r in (await api.json())["items"]}
    row = rows["web-session-0003"]
    assert (row["topic"], row["summary_line"], row["first_question"]) == (topic, None, asked)
    # A summary, once there is one, says more: the topic stays behind it.
    whatsapp = rows[WHATSAPP]
    assert whatsapp["topic"] == "What does shipping to Belgium cost?"
    assert whatsapp["summary_line"] == SUMMARY.splitlines()[0]

    html = await console.page("/admin/conversations")

    def about(conversation_id: int) -> str:
        found = re.search(
            rf'<tr data-conversation="{conversation_id}">.*?'
            r'<td data-label="About" class="summary-line">(.*?)</td>',
            html,
            re.DOTALL,
        )
        assert found is not None, html
        return found.group(1)

    assert about(row["id"]) == f'<span class="topic">{topic}</span>'
    assert about(whatsapp["id"]) == SUMMARY.splitlines()[0]
    # The conversation's own page says it too, until a summary takes its place.
    page = await console.page(f"/admin/conversations/{row['id']}")
    assert f'<div class="summary-text topic"><p>{topic}</p></div>' in page
    assert "No summary yet" not in page


async def test_the_conversation_list_filters_and_pages(
    console: Console, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = console.data.conversations

    def listed(html: str) -> set[int]:
        return {int(i) for i in re.findall(r'<tr data-conversation="(\d+)">', html)}

    html = await console.page("/admin/conversations?channel=whatsapp")
    assert listed(html) == {ids[WHATSAPP]}
    assert 'option value="whatsapp" selected' in html
    html = await console.page("/admin/conversations?waiting=1")
    assert listed(html) == {ids[TELEGRAM]}
    html = await console.page("/admin/conversations?low_confidence=1")
    assert ids["web-session-0002"] in listed(html)  # its question found nothing
    assert ids["web-session-0001"] not in listed(html)
    html = await console.page("/admin/conversations?agent=help")
    assert listed(html) == set()
    assert "No conversations match these filters." in html
    assert "Dates are days in UTC.</p>" in html  # one agent: its zone, for dates and times
    # Agents in different zones: the dates are UTC days, each row shows its agent's time.
    html = await console.page("/admin/conversations?from=2000-01-01")
    assert (
        "Dates are days in UTC. Times in the list are each agent's own (Europe/Amsterdam, UTC).</p>"
    ) in html
    html = await console.page("/admin/conversations?from=2000-01-01&to=2000-01-31")
    assert listed(html) == set()
    html = await console.page("/admin/conversations?from=2000-01-01")
    assert len(listed(html)) == 5
    bad = await console.page("/admin/conversations?from=yesterday", status=400)
    assert "is not a date" in bad

    monkeypatch.setattr(conversation_pages, "PAGE_SIZE", 2)
    seen: list[int] = []
    path = "/admin/conversations?channel="
    for _ in range(5):
        html = await console.page(path)
        seen += sorted(listed(html), reverse=True)
        older = re.search(r'<a href="([^"]+)" rel="next">', html)
        if older is None:
            break
        path = older.group(1).replace("&amp;", "&")
    assert sorted(seen) == sorted(ids.values())
    assert "← Newest" in html


async def test_the_conversation_page_shows_summary_transcript_and_traces(
    console: Console,
) -> None:
    whatsapp = console.data.conversations[WHATSAPP]
    # A model's answer that was checked: each answer gate a line of its trace.
    gates = [
        {"gate": "validate", "attempt": 1, "verdict": "failed", "reasons": ["citation [7] refers to no source"]},
        {"gate": "critic", "attempt": 2, "verdict": "not_checked", "reasons": ["the critic timed out"], "model": "critic-x"},
    ]  # fmt: skip
    # ... whose question was translated for the search, and what the answer cache, the
    # quotas and related reading made of it.
    steps = {
        "translated_query": "shipping costs Belgium",
        "translation": {"from": "nl", "to": "en", "method": "model", "ms": 210.0},
        "answer_cache": "hit",
        "answer_cache_match": {"how": "semantic", "similarity": 0.95, "question": "Cost?"},
        "quota": {"visitor_day": 3, "agent_month": None},
        "related": ["https://shop.example/en/returns"],
    }
    await console.pool.execute(
        "UPDATE turns SET trace = trace || $1::jsonb WHERE id = (SELECT min(t.id) FROM turns t "
        "JOIN conversations c ON c.id = t.conversation_id WHERE c.id = $2)",
        {"gates": gates, **steps}, whatsapp,
    )  # fmt: skip
    html = await console.page(f"/admin/conversations/{whatsapp}")
    assert "<li>Validation, draft 1: failed: citation [7] refers to no source</li>" in html
    assert '<li>Critic, draft 2 <span class="muted">(critic-x)</span>: not checked: ' in html
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))
    assert "Translated shipping costs Belgium (nl → en)" in text
    assert "Answer cache hit (semantic, similarity 0.95, cached for “Cost?”)" in text
    assert "Quota left this visitor today: 3; the agent this month: unlimited" in text
    assert "Related reading https://shop.example/en/returns" in text
    summary_at = html.index("Summary</h2>")
    transcript_at = html.index("Transcript</h2>")
    assert summary_at < transcript_at
    for line in SUMMARY.splitlines():
        assert f"<p>{line}</p>" in html
    assert html.count('class="msg visitor"') == 2
    assert html.count('class="msg assistant"') == 2
    assert "What does shipping to Belgium cost?" in html
    assert "Shipping costs 4.95 euro [1]." in html  # the price, from the shipping page
    # Each answer's trace: the search query, what was retrieved with scores, timings.
    assert html.count('<details class="trace">') == 2
    assert "Search query</dt><dd>What does shipping to Belgium cost?" in html
    assert "https://shop.example/en/shipping" in html
    assert re.search(r"<td>0\.\d{3}</td>", html)
    assert re.search(r"Timings: .*retrieve \d+ ms.*total \d+ ms", html)
    assert "Take over</button>" in html
    assert "Reply to the customer" in html
    assert "(queued, then delivered)" in html

    telegram = await console.page(f"/admin/conversations/{console.data.conversations[TELEGRAM]}")
    assert "The customer asked for a person." in telegram
    # Too short for a summary: its topic, from the first exchange, stands in for one.
    assert "No summary yet" not in telegram
    assert '<div class="summary-text topic"><p>Can I return an item?</p></div>' in telegram
    api = await console.page(
        f"/admin/conversations/{console.data.conversations['api-customer-42']}"
    )
    assert "Staff cannot write to a customer on the API channel." in api
    missing = await console.page("/admin/conversations/999999", status=404)
    assert "no conversation 999999" in missing


async def test_the_agent_pages_render_with_real_data(console: Console) -> None:
    shop = console.shop
    gaps = await console.page(f"{shop}/gaps")
    assert "do you repair bicycles" in gaps.lower()
    assert re.search(r'<strong class="count">2×</strong>', gaps)  # both wordings, one group
    assert "Resolved</button>" in gaps

    sources = await console.page(f"{shop}/sources")
    assert "pages.jsonl" in sources
    assert "HTTP 404 from https://shop.example/broken" in sources
    assert 'class="badge source-failed">failed' in sources
    assert 'class="badge source-ready">ready' in sources
    assert "Re-index</button>" in sources

    curated = await console.page(f"{shop}/curated")
    assert "When is the shop open?" in curated
    assert 'class="hits">2×</td>' in curated
    assert "opening hours" in curated

    checks = await console.page(f"{shop}/checks")
    assert "1 of 2</strong> passed" in checks
    assert 'class="badge pass">pass' in checks
    assert 'class="badge fail">fail' in checks
    assert "The page was not cited." in checks

    settings = await console.page(f"{shop}/settings")
    assert 'value="Noordkaap Shop"' in settings
    assert 'value="Europe/Amsterdam"' in settings
    assert 'value="50"' in settings  # the threshold, in percent
    assert 'name="hours_mon" type="text" value="09:00-17:30"' in settings
    assert 'name="hours_sat" type="text" value="closed"' in settings
    assert 'name="hours_tue" type="text" value="closed"' in settings
    assert f'value="{TWILIO_SID}"' in settings
    assert re.search(r'data-secret="twilio_auth_token">set<', settings)
    assert re.search(r'data-secret="telegram_bot_token">set<', settings)
    assert console.data.agent.widget_key in settings

    playground = await console.page(f"{shop}/playground")
    assert 'data-endpoint="/api/v1/admin/agents/shop/playground"' in playground
    agents = await console.page("/admin/agents")
    assert "Noordkaap Shop" in agents
    assert "Help Desk" in agents
    assert (await console.client.get("/admin", allow_redirects=False)).status == 303
    missing = await console.page("/admin/agents/nope/gaps", status=404)
    assert "unknown agent" in missing


async def test_secrets_never_appear_in_any_page(console: Console) -> None:
    shop = console.shop
    paths = [
        "/admin/conversations",
        "/admin/agents",
        *(f"/admin/conversations/{i}" for i in console.data.conversations.values()),
        *(
            f"{shop}/{p}"
            for p in ("gaps", "sources", "curated", "checks", "playground", "settings")
        ),
        f"{shop}/curated/{console.data.curated_id}",
    ]
    for path in paths:
        html = await console.page(path)
        for secret in SECRETS:
            assert secret not in html, (path, secret)
    # Not even after saving them, or after a form with an error.
    await console.submit(
        f"{shop}/settings/channels",
        {
            "twilio_auth_token": "another-secret-token",
            "telegram_webhook_secret": "new-secret_1-0123456789abcdefghijklmno",
        },
    )
    html = await console.page(f"{shop}/settings")
    assert "another-secret-token" not in html
    assert "new-secret_1-0123456789abcdefghijklmno" not in html
    failed = await console.post(f"{shop}/settings/channels", {"telegram_bot_token": "bad token"})
    assert failed.status == 400
    assert "bad token" not in await failed.text()


# -- the forms ------------------------------------------------------------------------------


async def test_take_over_reply_and_hand_back(console: Console) -> None:
    pool = console.pool
    whatsapp = console.data.conversations[WHATSAPP]
    base = f"/admin/conversations/{whatsapp}"
    assert await console.submit(f"{base}/take-over") == f"{base}?done=taken-over#reply"
    html = await console.page(f"{base}?done=taken-over")
    assert "You have taken this conversation over" in html
    assert "admin took the conversation over." in html
    assert "Hand back to the bot</button>" in html
    assert await pool.fetchval("SELECT status FROM conversations WHERE id = $1", whatsapp) == (
        "staff"
    )

    await console.submit(f"{base}/reply", {"text": "Hi, this is Sam: yes, we repair bikes."})
    stored = await pool.fetchrow(
        "SELECT id, role, text, author FROM messages WHERE conversation_id = $1 ORDER BY id DESC",
        whatsapp,
    )
    assert (stored["role"], stored["text"], stored["author"]) == (
        "staff",
        "Hi, this is Sam: yes, we repair bikes.",
        "admin",
    )
    queued = await pool.fetchrow(
        "SELECT channel, recipient, body FROM outbox WHERE message_id = $1", stored["id"]
    )
    assert dict(queued) == {
        "channel": "whatsapp",
        "recipient": WHATSAPP,
        "body": "Hi, this is Sam: yes, we repair bikes.",
    }
    html = await console.page(base)
    assert 'class="msg staff"' in html
    assert "Staff (admin)" in html

    empty = await console.post(f"{base}/reply", {"text": "   "})
    assert empty.status == 400
    assert "Reply:" in await empty.text()

    await console.submit(f"{base}/hand-back")
    assert await pool.fetchval("SELECT status FROM conversations WHERE id = $1", whatsapp) == "bot"
    assert "The conversation went back to the bot." in await console.page(base)

    api = console.data.conversations["api-customer-42"]
    refused = await console.post(f"/admin/conversations/{api}/take-over")
    assert refused.status == 400
    assert "cannot reach a visitor on the api channel" in await refused.text()


async def test_resolving_a_gap_group(console: Console) -> None:
    pool = console.pool
    html = await console.page(f"{console.shop}/gaps")
    groups = re.findall(r'name="gap_ids" value="([\d,]+)"', html)
    assert len(groups) >= 2
    first = [int(i) for i in groups[0].split(",")]
    assert await console.submit(f"{console.shop}/gaps/resolve", {"gap_ids": groups[0]}) == (
        f"{console.shop}/gaps?done=gaps-resolved"
    )
    open_ids = await pool.fetch("SELECT id FROM content_gaps WHERE resolved_at IS NULL")
    assert {r["id"] for r in open_ids} == {int(i) for g in groups[1:] for i in g.split(",")}
    html = await console.page(f"{console.shop}/gaps?done=gaps-resolved")
    assert "Marked as resolved." in html
    assert f'value="{groups[0]}"' not in html
    for group in groups[1:]:
        await console.submit(f"{console.shop}/gaps/resolve", {"gap_ids": group})
    assert "No open content gaps." in await console.page(f"{console.shop}/gaps")
    assert await pool.fetchval(
        "SELECT count(*) FROM content_gaps WHERE id = ANY($1) AND resolved_at IS NOT NULL", first
    ) == len(first)
    bad = await console.post(f"{console.shop}/gaps/resolve", {"gap_ids": "one,two"})
    assert bad.status == 400


async def test_adding_reindexing_and_removing_sources(console: Console) -> None:
    shop, pool = console.shop, console.pool
    await console.submit(
        f"{shop}/sources",
        {"kind": "text", "title": "Gift cards", "text": "Gift cards are sold in every shop."},
    )
    await console.client.server.app[ADMIN].sources.wait()
    source = await pool.fetchrow("SELECT id, status, location FROM sources WHERE kind = 'text'")
    assert (source["status"], source["location"]) == ("ready", "/texts/gift-cards")
    html = await console.page(f"{shop}/sources")
    assert "/texts/gift-cards" in html

    await console.submit(f"{shop}/sources/{source['id']}/reindex")
    await console.client.server.app[ADMIN].sources.wait()
    assert await pool.fetchval("SELECT status FROM sources WHERE id = $1", source["id"]) == "ready"

    await console.submit(f"{shop}/sources/{source['id']}/remove")
    assert await pool.fetchval("SELECT count(*) FROM sources WHERE id = $1", source["id"]) == 0

    bad = await console.post(f"{shop}/sources", {"kind": "url", "url": "ftp://shop.example/"})
    assert bad.status == 400
    html = await bad.text()
    assert "http(s) URL" in html
    assert 'value="ftp://shop.example/"' in html  # what was typed stays


async def test_creating_editing_and_deleting_curated_answers(console: Console) -> None:
    shop, pool = console.shop, console.pool
    await console.submit(
        f"{shop}/curated",
        {
            "question": "Do you sell gift cards?",
            "keywords": "gift card, voucher",
            "answer": "Yes, from 10 to 100 euro.",
            "language": "en",
            "enabled": "on",
        },
    )
    row = await pool.fetchrow(
        "SELECT id, keywords, enabled, language FROM curated_answers WHERE answer LIKE 'Yes,%'"
    )
    assert (row["keywords"], row["enabled"], row["language"]) == (
        ["gift card", "voucher"],
        True,
        "en",
    )
    edit = await console.page(f"{shop}/curated/{row['id']}")
    assert 'value="gift card, voucher"' in edit
    await console.submit(
        f"{shop}/curated/{row['id']}",
        {"question": "Do you sell gift cards?", "keywords": "", "answer": "Yes, 10-100 euro."},
    )
    changed = await pool.fetchrow(
        "SELECT answer, keywords, enabled FROM curated_answers WHERE id = $1", row["id"]
    )
    assert dict(changed) == {"answer": "Yes, 10-100 euro.", "keywords": [], "enabled": False}

    no_trigger = await console.post(f"{shop}/curated", {"answer": "Orphan answer"})
    assert no_trigger.status == 400
    html = await no_trigger.text()
    assert "give a question, keywords or a pattern" in html
    assert "Orphan answer" in html

    await console.submit(f"{shop}/curated/{row['id']}/delete")
    assert await pool.fetchval("SELECT count(*) FROM curated_answers WHERE id = $1", row["id"]) == 0


async def test_adding_and_deleting_answer_checks(console: Console) -> None:
    shop, pool = console.shop, console.pool
    await console.submit(
        f"{shop}/checks",
        {"question": "What does shipping cost?", "expected_facts": "4.95\neuro\n", "must_cite": ""},
    )
    check = await pool.fetchrow(
        "SELECT id, expected_facts, must_cite FROM answer_checks WHERE question LIKE 'What does%'"
    )
    assert (check["expected_facts"], check["must_cite"]) == (["4.95", "euro"], None)
    assert "not run yet" in await console.page(f"{shop}/checks")
    bad = await console.post(f"{shop}/checks", {"question": "Anything?"})
    assert bad.status == 400
    assert "give expected_facts or must_cite" in await bad.text()
    await console.submit(f"{shop}/checks/{check['id']}/delete")
    assert await pool.fetchval("SELECT count(*) FROM answer_checks") == 2


async def test_saving_the_agent_settings(console: Console) -> None:
    shop, pool = console.shop, console.pool
    form = {
        "name": "Noordkaap",
        "persona": "A friendly outdoor shop assistant.",
        "custom_prompt": "",
        "default_language": "nl",
        "timezone": "Europe/Brussels",
        "threshold": "40",
        "contact_route": "support@shop.example",
        "allowed_origins": "https://shop.example\nhttps://www.shop.example/",
        "hours_mon": "09:00-12:00, 13:00-17:30",
        "hours_tue": "09:00-17:30",
        "handoff_enabled": "on",
        "handoff_text": "",
        "handoff_text_nl": "Een collega komt eraan.",
        "out_of_hours_text": "We are closed; we will reply tomorrow.",
        "exclude_tags": "Internal, drafts",
        "tag_rules": "/en/faq*  faq, Help\n",
        "include_tags_whatsapp": "mobile",
        "quota_visitor_day": "20",  # the answer cache left unticked: off
    }
    assert await console.submit(f"{shop}/settings", form) == f"{shop}/settings?done=settings-saved"
    row = await pool.fetchrow(
        """SELECT name, persona, default_language, timezone, confidence_threshold, contact_route,
                  allowed_origins, settings FROM agents WHERE slug = 'shop'"""
    )
    assert row["name"] == "Noordkaap"
    assert row["default_language"] == "nl"
    assert row["timezone"] == "Europe/Brussels"
    assert row["confidence_threshold"] == pytest.approx(0.4)
    assert row["allowed_origins"] == ["https://shop.example", "https://www.shop.example"]
    settings = row["settings"]
    assert settings["business_hours"]["mon"] == ["09:00-12:00", "13:00-17:30"]
    assert settings["business_hours"]["wed"] == "closed"
    assert settings["handoff_text"] == {"nl": "Een collega komt eraan."}
    assert settings["out_of_hours_text"] == "We are closed; we will reply tomorrow."
    assert opened(settings["twilio"]["auth_token"]) == TWILIO_TOKEN  # untouched by this form
    assert settings["exclude_tags"] == ["drafts", "internal"]
    assert settings["tag_rules"] == [{"pattern": "/en/faq*", "tags": ["faq", "help"]}]
    assert settings["channel_filters"] == {
        "whatsapp": {"include_tags": ["mobile"], "exclude_tags": []}
    }
    assert "include_tags" not in settings
    assert (settings["quota_visitor_day"], settings["answer_cache"]) == (20, False)
    assert "quota_agent_month" not in settings  # left empty: the server's default
    # The stored pages carry the rule's tags at once.
    assert await pool.fetchval(
        "SELECT tags FROM pages WHERE url = 'https://shop.example/en/faq'"
    ) == ["faq", "help"]
    html = await console.page(f"{shop}/settings?done=settings-saved")
    assert "Settings saved." in html
    assert 'value="40"' in html
    assert "/en/faq* faq, help</textarea>" in html

    for field, value, said in [
        ("timezone", "Mars/Olympus", "is not an IANA time zone"),
        ("threshold", "eighty", "is not a percentage"),
        ("hours_mon", "nine to five", "is not a range"),
        ("allowed_origins", "shop.example", "is not an origin"),
        ("tag_rules", "faq/* faq", "URL rule 1 (faq/* faq), pattern: &#39;faq/*&#39; is not a URL"),
        ("exclude_tags", "two words", "Never pages tagged: &#39;two words&#39; is not a tag"),
        ("quota_agent_month", "-3", "quota_agent_month: give a whole number of answers"),
    ]:
        failed = await console.post(f"{shop}/settings", {**form, field: value})
        assert failed.status == 400, field
        html = await failed.text()
        assert said in html
        assert value in html  # the form keeps what was typed
    assert await pool.fetchval("SELECT timezone FROM agents WHERE slug = 'shop'") == (
        "Europe/Brussels"
    )

    # Hours left empty on every day: staff are taken to be there at any time.
    await console.submit(f"{shop}/settings", {**form, "hours_mon": "", "hours_tue": ""})
    assert "business_hours" not in (
        await pool.fetchval("SELECT settings FROM agents WHERE slug = 'shop'")
    )

    # Exploration mode has a form of its own; an empty bound is the default.
    explore = {"exploration": "on", "exploration_steps": "5", "exploration_seconds": ""}
    saved = await console.submit(f"{shop}/settings/exploration", explore)
    assert saved == f"{shop}/settings?done=exploration-saved#exploration"
    settings = await pool.fetchval("SELECT settings FROM agents WHERE slug = 'shop'")
    assert (settings["exploration"], settings["exploration_steps"]) == (True, 5)
    assert "exploration_seconds" not in settings
    assert 'id="f-exploration" name="exploration" type="checkbox" checked' in (
        await console.page(f"{shop}/settings")
    )
    refused = await console.post(f"{shop}/settings/exploration", {"exploration_steps": "50"})
    assert refused.status == 400
    assert "give a whole number of tool calls, 1 to 20" in await refused.text()


async def test_channel_credentials_are_write_only(console: Console) -> None:
    shop, pool = console.shop, console.pool
    await console.submit(
        f"{shop}/settings/channels",
        {
            "twilio_account_sid": TWILIO_SID,
            "twilio_whatsapp_from": "whatsapp:+3197010000001",
            "twilio_auth_token": "",
            "telegram_bot_token": "",
            "telegram_webhook_secret": "rotated_secret-0123456789abcdefghijklm",
        },
    )
    settings = await pool.fetchval("SELECT settings FROM agents WHERE slug = 'shop'")
    assert {**settings["twilio"], "auth_token": opened(settings["twilio"]["auth_token"])} == {
        "account_sid": TWILIO_SID,
        "auth_token": TWILIO_TOKEN,  # empty: kept
        "whatsapp_from": "whatsapp:+3197010000001",
    }
    assert {name: opened(value) for name, value in settings["telegram"].items()} == {
        "bot_token": BOT_TOKEN,
        "webhook_secret": "rotated_secret-0123456789abcdefghijklm",
    }
    for secret in (
        WEBHOOK_SECRET,
        "rotated_secret-0123456789abcdefghijklm",
        BOT_TOKEN,
        TWILIO_TOKEN,
    ):
        assert secret not in str(settings)  # stored encrypted only

    await console.submit(f"{shop}/settings/channels", {"telegram_remove": "on"})
    settings = await pool.fetchval("SELECT settings FROM agents WHERE slug = 'shop'")
    assert "telegram" not in settings
    html = await console.page(f"{shop}/settings")
    assert re.search(r'data-secret="telegram_bot_token">not set<', html)
    assert re.search(r'data-secret="twilio_auth_token">set<', html)


async def test_rotating_the_widget_key(console: Console) -> None:
    old = console.data.agent.widget_key
    location = await console.submit(f"{console.shop}/settings/widget-key")
    assert location == f"{console.shop}/settings?done=widget-key-rotated#widget"
    new = await console.pool.fetchval("SELECT widget_key FROM agents WHERE slug = 'shop'")
    assert new != old
    html = await console.page(f"{console.shop}/settings?done=widget-key-rotated")
    assert new in html
    assert old not in html
    assert "New widget key made" in html


async def test_the_inbox_lists_failed_and_stuck_messages_and_retries_them(
    console: Console,
) -> None:
    pool, agent = console.pool, console.data.agent

    async def message(sid: str, key: str, body: str, channel: str = "whatsapp") -> int:
        payload = {"MessageSid": sid, "From": key, "Body": body, "NumMedia": "0"}
        assert await add_delivery(Inbox(pool), agent.id, channel, sid, key, payload)
        found: int = await pool.fetchval("SELECT id FROM inbox WHERE provider_message_id = $1", sid)
        return found

    failed = await message("SM-failed", WHATSAPP, "Do you ship to <b>Norway</b>?")
    stuck = await message("SM-stuck", "whatsapp:+31600000001", "Where is my order?")
    fresh = await message("SM-fresh", "whatsapp:+31600000002", "Just arrived")
    done = await message("SM-done", "whatsapp:+31600000003", "Answered long ago")
    await pool.execute(
        """UPDATE inbox SET received_at = now() - interval '1 hour' WHERE id = ANY($1)""",
        [failed, stuck, done],
    )
    await pool.execute(
        """UPDATE inbox SET status = 'failed', attempts = 3, processed_at = now(),
                            error = 'the answer could not be generated (llm_failed)'
            WHERE id = $1""",
        failed,
    )
    await pool.execute(
        """UPDATE inbox SET attempts = 2, next_attempt_at = now() + interval '10 minutes',
                            error = 'language model failed: status 500'
            WHERE id = $1""",
        stuck,
    )
    await pool.execute("UPDATE inbox SET status = 'done' WHERE id = $1", done)

    html = await console.page("/admin/inbox")
    # Failed ones first, then those still waiting.
    assert re.findall(r'data-inbox="(\d+)"', html) == [str(failed), str(stuck)]
    assert f'data-inbox="{fresh}"' not in html
    assert f'data-inbox="{done}"' not in html
    assert "Do you ship to &lt;b&gt;Norway&lt;/b&gt;?" in html
    assert "language model failed: status 500" in html
    assert f'href="/admin/conversations/{console.data.conversations[WHATSAPP]}"' in html
    # Each failed or paused message has its own retry button; failed ones all at once too.
    assert sorted(re.findall(r'name="ids" value="([\d,]+)"', html)) == sorted(
        [str(failed), str(failed), str(stuck)]
    )

    assert await console.submit("/admin/inbox/retry", {"ids": str(failed)}) == (
        "/admin/inbox?done=inbox-retried"
    )
    row = await pool.fetchrow(
        "SELECT status, attempts, requeued_at, next_attempt_at <= now() AS due FROM inbox "
        "WHERE id = $1",
        failed,
    )
    assert (row["status"], row["attempts"], row["due"]) == ("pending", 0, True)
    assert row["requeued_at"] is not None
    html = await console.page("/admin/inbox?done=inbox-retried")
    assert "Taken up again" in html
    assert "No failed messages." in html
    await console.submit("/admin/inbox/retry", {"ids": str(stuck)})
    assert await pool.fetchval("SELECT next_attempt_at <= now() FROM inbox WHERE id = $1", stuck)
    assert 'name="ids"' not in await console.page("/admin/inbox")  # nothing left to hurry

    bad = await console.post("/admin/inbox/retry", {"ids": "one,two"})
    assert bad.status == 400
    assert "Inbox: failed and late answers" in await bad.text()


async def test_a_notice_is_one_of_ours_or_none(console: Console) -> None:
    html = await console.page("/admin/conversations?done=<script>alert(1)</script>")
    assert "<script>alert" not in html
    assert 'class="notice"' not in html
