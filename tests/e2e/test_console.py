"""The staff console in headless Chromium, on the gateway built by create_app with real data."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestServer
from playwright.async_api import Browser, Page, expect

from channels.registry import BY_NAME
from core.retrieval.embedders import UseEmbedder
from core.settings import Settings
from core.store import Database
from core.store.inbox import Inbox
from gateway.app import create_app
from tests.conftest import MakeSettings
from tests.e2e.browser import ARTIFACTS, chromium
from tests.support.console import SUMMARY, TOKEN, WHATSAPP, Seeded, seed
from tests.support.deliveries import add_delivery


@dataclass
class Console:
    server: TestServer
    pool: asyncpg.Pool
    data: Seeded

    def url(self, path: str) -> str:
        return str(self.server.make_url(path))


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as launched:
        yield launched


@pytest.fixture
async def console(
    make_settings: MakeSettings,
    settings: Settings,
    database: Database,
    cache: Any,
    use_embedder: UseEmbedder,
    tmp_path: Path,
) -> AsyncIterator[Console]:
    data = await seed(settings, database, cache, use_embedder, tmp_path)
    server = TestServer(create_app(make_settings(admin_token=TOKEN)))
    await server.start_server()
    yield Console(server, database.pool, data)
    await server.close()


async def signed_in(browser: Browser, console: Console, width: int = 1024) -> Page:
    page = await browser.new_page(viewport={"width": width, "height": 800})
    await page.goto(console.url("/admin"))
    await expect(page.get_by_role("heading", name="Parley staff console")).to_be_visible()
    await page.get_by_label("Admin token", exact=True).fill(TOKEN)
    await page.get_by_role("button", name="Sign in with the token", exact=True).click()
    await expect(page.get_by_role("heading", name="Conversations", exact=True)).to_be_visible()
    return page


async def test_filter_open_take_over_and_reply(browser: Browser, console: Console) -> None:
    page = await signed_in(browser, console)
    rows = page.locator("table.conversations tbody tr")
    await expect(rows).to_have_count(5)
    await expect(page.get_by_text(SUMMARY.splitlines()[0])).to_be_visible()
    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=ARTIFACTS / "console-conversations.png", full_page=True)

    await page.get_by_label("Channel").select_option(label=BY_NAME["whatsapp"].title)
    await page.get_by_role("button", name="Filter").click()
    await expect(rows).to_have_count(1)
    assert "channel=whatsapp" in page.url
    await expect(page.get_by_label("Channel")).to_have_value("whatsapp")

    await rows.get_by_role("link", name=WHATSAPP).click()
    await expect(page.get_by_role("heading", name=f"Conversation with {WHATSAPP}")).to_be_visible()
    summary = page.get_by_role("region", name="Summary")
    await expect(summary).to_contain_text(SUMMARY.splitlines()[2])
    trace = page.locator("details.trace").first
    await expect(trace.get_by_text("Search query")).to_be_hidden()
    await trace.locator("summary").click()
    await expect(trace.get_by_text("Search query")).to_be_visible()
    await expect(trace.get_by_role("table", name="Retrieved sources")).to_be_visible()
    await expect(trace.get_by_role("cell", name="https://shop.example/en/shipping")).to_be_visible()
    await expect(trace.locator(".timings")).to_contain_text("retrieve")

    await page.get_by_role("button", name="Take over").click()
    await expect(page.get_by_role("status")).to_have_text(
        "You have taken this conversation over; the bot is paused."
    )
    await expect(page.get_by_role("button", name="Hand back to the bot")).to_be_visible()
    reply = "Hello, Sam here: we do repair bicycles in our Utrecht shop."
    await page.get_by_label("Reply to the customer").fill(reply)
    await page.get_by_role("button", name="Send reply").click()
    await expect(page.get_by_role("status")).to_have_text("Your reply is on its way.")
    sent = page.locator(".msg.staff").last
    await expect(sent).to_contain_text(reply)
    await expect(sent.locator(".delivery")).to_have_text("queued")
    await page.screenshot(path=ARTIFACTS / "console-conversation.png", full_page=True)

    conversation = console.data.conversations[WHATSAPP]
    stored = await console.pool.fetchrow(
        """SELECT m.author, o.channel, o.recipient, o.body, o.status FROM messages m
             JOIN outbox o ON o.message_id = m.id
            WHERE m.conversation_id = $1 AND m.role = 'staff'""",
        conversation,
    )
    assert dict(stored) == {
        "author": "admin",
        "channel": "whatsapp",
        "recipient": WHATSAPP,
        "body": reply,
        "status": "pending",
    }
    assert (
        await console.pool.fetchval("SELECT status FROM conversations WHERE id = $1", conversation)
        == "staff"
    )

    await page.get_by_role("button", name="Hand back to the bot").click()
    await expect(page.get_by_role("status")).to_have_text("The conversation is back with the bot.")
    await page.close()


async def test_create_a_curated_answer(browser: Browser, console: Console) -> None:
    page = await signed_in(browser, console)
    await page.locator(".agent-nav summary").click()
    await page.get_by_role("link", name="Noordkaap Shop").click()
    await expect(page.get_by_role("heading", name="Settings · Noordkaap Shop")).to_be_visible()
    await page.get_by_role("link", name="Curated answers").click()
    await expect(
        page.get_by_role("heading", name="Curated answers · Noordkaap Shop")
    ).to_be_visible()
    form = page.locator("form", has=page.get_by_role("button", name="Add curated answer"))
    await form.get_by_label("Question").fill("Do you sell gift cards?")
    await form.get_by_label("Keywords").fill("gift card, voucher")
    await form.get_by_label("Answer").fill("Yes: gift cards from 10 to 100 euro, in every shop.")
    await form.get_by_role("button", name="Add curated answer").click()
    await expect(page.get_by_role("status")).to_have_text("Curated answer added.")
    row = page.locator("table.curated tbody tr", has_text="Do you sell gift cards?")
    await expect(row).to_contain_text("keywords: gift card, voucher")
    await expect(row.locator(".hits")).to_have_text("0×")
    stored = await console.pool.fetchrow(
        "SELECT keywords, answer, enabled FROM curated_answers WHERE question = $1",
        "Do you sell gift cards?",
    )
    assert dict(stored) == {
        "keywords": ["gift card", "voucher"],
        "answer": "Yes: gift cards from 10 to 100 euro, in every shop.",
        "enabled": True,
    }
    await page.close()


async def test_the_playground_streams_an_answer_with_diagnostics(
    browser: Browser, console: Console
) -> None:
    page = await signed_in(browser, console)
    await page.goto(console.url("/admin/agents/shop/playground"))
    await page.get_by_label("Reply language").select_option("en")
    await page.get_by_label("Customer segment").fill("business")
    await page.get_by_label("Message").fill("How long does delivery to Belgium take?")
    await page.get_by_role("button", name="Send", exact=True).click()
    reply = page.locator("[data-log] .msg.assistant").last
    await expect(reply).to_have_attribute("data-state", "done")
    await expect(reply.locator(".answer")).to_contain_text("2-3 working days")
    await expect(reply.locator(".sources a").first).to_have_attribute(
        "href", "https://shop.example/en/faq"
    )
    diagnostics = page.locator("[data-diagnostics]")
    await expect(diagnostics).to_contain_text("How long does delivery to Belgium take?")
    await expect(diagnostics).to_contain_text("segment: business")
    await expect(diagnostics.get_by_role("table", name="Retrieved sources")).to_be_visible()
    await expect(diagnostics.locator(".timings")).to_contain_text("total")
    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=ARTIFACTS / "console-playground.png", full_page=True)

    # The same chat goes on; the playground is not among the customers' conversations.
    await page.get_by_label("Message").fill("And what does it cost?")
    await page.get_by_label("Message").press("Enter")
    await expect(page.locator("[data-log] .msg.assistant")).to_have_count(2)
    await expect(page.locator("[data-log] .msg.assistant").last).to_have_attribute(
        "data-state", "done"
    )
    chats = await console.pool.fetch(
        "SELECT conversation_key FROM conversations WHERE channel = 'playground'"
    )
    assert len(chats) == 1
    turns = await console.pool.fetchval(
        "SELECT count(*) FROM turns t JOIN conversations c ON c.id = t.conversation_id "
        "WHERE c.channel = 'playground'"
    )
    assert turns == 2
    await page.goto(console.url("/admin/conversations"))
    await expect(page.locator("table.conversations tbody tr")).to_have_count(5)
    await page.close()


async def test_the_console_fits_a_phone(browser: Browser, console: Console) -> None:
    page = await signed_in(browser, console, width=360)
    await expect(page.locator("table.conversations tbody tr").first).to_be_visible()
    assert await page.evaluate("document.documentElement.scrollWidth") <= 360
    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=ARTIFACTS / "console-phone.png", full_page=True)
    await page.goto(console.url(f"/admin/conversations/{console.data.conversations[WHATSAPP]}"))
    await expect(page.get_by_role("button", name="Take over")).to_be_visible()
    assert await page.evaluate("document.documentElement.scrollWidth") <= 360
    await page.goto(console.url("/admin/agents/shop/settings"))
    await expect(page.get_by_role("button", name="Save settings")).to_be_visible()
    assert await page.evaluate("document.documentElement.scrollWidth") <= 360
    await page.goto(console.url("/admin/agents/shop/sources"))
    assert await page.evaluate("document.documentElement.scrollWidth") <= 360
    await page.get_by_role("link", name="Pages & tags").first.click()
    await expect(page.get_by_role("button", name="Save source tags")).to_be_visible()
    assert await page.evaluate("document.documentElement.scrollWidth") <= 360
    await page.close()


async def _troubled_inbox(console: Console) -> tuple[int, int]:
    """A message whose answer failed and one waiting out a pause after a failed try."""
    pool, agent = console.pool, console.data.agent
    ids = []
    for sid, key, body in [
        ("SM-failed", WHATSAPP, "Do you ship to Norway? " + "I would like to know soon. " * 6),
        ("SM-stuck", "whatsapp:+31600000001", "Where is my order?"),
    ]:
        payload = {"MessageSid": sid, "From": key, "Body": body, "NumMedia": "0"}
        assert await add_delivery(Inbox(pool), agent.id, "whatsapp", sid, key, payload)
        ids.append(await pool.fetchval("SELECT id FROM inbox WHERE provider_message_id = $1", sid))
    failed, stuck = ids
    await pool.execute(
        "UPDATE inbox SET received_at = now() - interval '1 hour' WHERE id = ANY($1)", ids
    )
    await pool.execute(
        """UPDATE inbox SET status = 'failed', attempts = 3, processed_at = now(),
                            error = 'the answer could not be generated (llm_failed)'
            WHERE id = $1""",
        failed,
    )
    await pool.execute(
        """UPDATE inbox SET attempts = 2, next_attempt_at = now() + interval '10 minutes',
                            error = 'language model failed: status 500' WHERE id = $1""",
        stuck,
    )
    return failed, stuck


@pytest.mark.parametrize("width", [1280, 360])
async def test_staff_see_failed_and_late_messages_and_retry_one(
    browser: Browser, console: Console, width: int
) -> None:
    failed, stuck = await _troubled_inbox(console)
    page = await signed_in(browser, console, width=width)
    await page.get_by_role("link", name="Inbox", exact=True).click()
    await expect(page.get_by_role("heading", name="Failed (1)")).to_be_visible()
    await expect(page.locator(f'tr[data-inbox="{failed}"]')).to_contain_text(
        "Do you ship to Norway?"
    )
    await expect(page.locator(f'tr[data-inbox="{stuck}"]')).to_contain_text("Where is my order?")
    assert await page.evaluate("document.documentElement.scrollWidth") <= width
    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=ARTIFACTS / f"console-inbox-{width}.png", full_page=True)

    await page.get_by_role("button", name=f"Retry the message from {WHATSAPP} now").click()
    await expect(page.get_by_role("heading", name="Failed (0)")).to_be_visible()
    status = await console.pool.fetchval("SELECT status FROM inbox WHERE id = $1", failed)
    assert status == "pending"
    await page.close()
